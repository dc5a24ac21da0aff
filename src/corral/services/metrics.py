"""``metrics/job``: a job's samples as dstack's series (``domain/metrics.py``), newest first.

The job is dstack's: the latest submission of ``(replica_num, job_num)`` of the run named (the live run of
that name, or the one ``run_id`` names); none is a 400 ``resource_not_exists``. ``limit + 1`` samples are
read (CPU needs the previous one) from one indexed range of the job's samples.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from corral.context import Context
from corral.domain.metrics import JobResources, job_series
from corral.domain.records import JobRec, ProjectRec
from corral.schemas.requests import JobMetricsQuery
from corral.services.errors import ResourceNotExists
from corral.services.serialize import iso
from corral.store import metrics as metrics_store
from corral.store import runs as run_store


def _micro(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp() * 1_000_000)


def resources_of(job: JobRec) -> JobResources:
    """The constants of the job's series, from its provisioning data (dstack: the offer's resources)."""
    jpd = job.job_provisioning_data or {}
    res = (jpd.get("instance_type") or {}).get("resources") if isinstance(jpd, dict) else None
    if not isinstance(res, dict):
        return JobResources()
    cpus, mem = res.get("cpus"), res.get("memory_mib")
    gpus = res.get("gpus") or []
    gpu_mem = gpus[0].get("memory_mib") if gpus and isinstance(gpus[0], dict) else None
    return JobResources(
        cpus=cpus if isinstance(cpus, int) else None,
        memory_bytes=int(mem) * 2**20 if isinstance(mem, (int, float)) else None,
        gpu_memory_bytes=int(gpu_mem) * 2**20 if isinstance(gpu_mem, (int, float)) else None,
    )


async def job_metrics(ctx: Context, project: ProjectRec, run_name: str, q: JobMetricsQuery) -> dict[str, Any]:
    async with ctx.db.read() as conn:
        run = await run_store.get_run(
            conn, project.id, run_name=run_name, run_id=str(q.run_id) if q.run_id is not None else None
        )
        candidates = [
            j
            for j in (run.jobs if run is not None and run.run_name == run_name else ())
            if j.replica_num == q.replica_num and j.job_num == q.job_num
        ]
        if not candidates:
            raise ResourceNotExists("Found no job with given parameters")
        job = max(candidates, key=lambda j: j.submission_num)
        points = await metrics_store.job_points(conn, job.id, q.limit + 1, _micro(q.after), _micro(q.before))
    return {
        "metrics": [
            {"name": s.name, "timestamps": [iso(t / 1_000_000) for t in s.timestamps_micro], "values": list(s.values)}
            for s in job_series(points, resources_of(job))
        ]
    }
