"""``GET /metrics``: dstack's Prometheus series and corral's own, rendered from current state.

dstack's (``services/prometheus/custom_metrics.py`` and ``client_metrics.py`` in 0.22.5): instance series
(``dstack_instance_duration_seconds_total``, ``_price_dollars_per_hour``, ``_gpu_count``), run counts
(``dstack_run_count_total``, ``_terminated_total``, ``_failed_total``, ``_done_total``), job series from each
live job's newest sample (``dstack_job_cpu_time_seconds_total``, ``dstack_job_memory_usage_bytes``,
``dstack_job_gpu_usage_ratio``, ...), with dstack's labels; then this process's counters and histograms
(``dstack_submit_to_provision_duration_seconds``), and ``dstack_pending_runs_total`` from the counts kept in the
database (``store/run_counts.py``: a run retried whole, where dstack's run goes back to ``pending``). corral's:
``corral_queue_length{project,fleet}``, ``corral_queue_wait_seconds``, ``corral_placements_total``,
``corral_commit_rejections_total``, ``corral_preemptions_total``,
``corral_proxy_requests_total{project,run,code}``; for each project with a quota policy
``corral_project_weighted_share{project}`` and ``corral_project_quota_used``, ``_quota_max``,
``_quota_nominal``, ``corral_project_entitlement`` ``{project,resource}``.
"""

from __future__ import annotations

from typing import Any

from corral.context import Context
from corral.domain.telemetry import Family, LabelBlocks, render
from corral.store import prometheus as store
from corral.store import run_counts

_INSTANCE = (
    ("dstack_instance_duration_seconds_total", "counter", "Total seconds the instance is running"),
    ("dstack_instance_price_dollars_per_hour", "gauge", "Instance price, USD/hour"),
    ("dstack_instance_gpu_count", "gauge", "Instance GPU count"),
)
_RUN = (
    ("dstack_run_count_total", "counter", "Total runs count"),
    ("dstack_run_count_terminated_total", "counter", "Terminated runs count"),
    ("dstack_run_count_failed_total", "counter", "Failed runs count"),
    ("dstack_run_count_done_total", "counter", "Done runs count"),
)
_JOB = (
    ("dstack_job_duration_seconds_total", "counter", "Total seconds the job is running"),
    ("dstack_job_price_dollars_per_hour", "gauge", "Job instance price, USD/hour"),
    ("dstack_job_gpu_count", "gauge", "Job GPU count"),
    ("dstack_job_cpu_count", "gauge", "Job CPU count"),
    ("dstack_job_cpu_time_seconds_total", "counter", "Total CPU time consumed by the job, seconds"),
    ("dstack_job_memory_total_bytes", "gauge", "Total memory allocated for the job, bytes"),
    ("dstack_job_memory_usage_bytes", "gauge", "Memory used by the job (including cache), bytes"),
    ("dstack_job_memory_working_set_bytes", "gauge", "Memory used by the job (not including cache), bytes"),
    ("dstack_job_gpu_usage_ratio", "gauge", "Job GPU usage, percent (as 0.0-1.0)"),
    ("dstack_job_gpu_memory_total_bytes", "gauge", "Total GPU memory allocated for the job, bytes"),
    ("dstack_job_gpu_memory_usage_bytes", "gauge", "GPU memory used by the job, bytes"),
)
#: dstack 0.22.5's name, type, help and labels (https://github.com/dstackai/dstack, 0.22.5,
#: src/dstack/_internal/server/services/prometheus/client_metrics.py, ``RunMetrics._pending_runs_total``); its
#: runs processing calls ``increment_pending_runs`` when an active run goes to ``pending`` (retried, no replica
#: left running), which corral counts as a run retried whole (``store/run_counts.py``).
_PENDING = ("dstack_pending_runs_total", "counter", "Number of pending runs")
_QUEUE = ("corral_queue_length", "gauge", "Jobs waiting in the queue, by project and the fleet their run is bound to")
#: The label blocks of the run counts' and instances' series, rendered once and kept while their labels do not
#: change (about 5 us of CPU a series otherwise: thousands of run count series a year in).
_RUN_LABELS = LabelBlocks(("dstack_project_name", "dstack_user_name"))
_INSTANCE_LABELS = LabelBlocks(
    (
        "dstack_project_name",
        "dstack_fleet_name",
        "dstack_fleet_id",
        "dstack_instance_name",
        "dstack_instance_id",
        "dstack_instance_type",
        "dstack_backend",
        "dstack_gpu",
    )
)


def _families(spec: tuple[tuple[str, str, str], ...]) -> dict[str, Family]:
    return {name: Family(name, typ, text) for name, typ, text in spec}


def _resources(doc: dict[str, Any]) -> dict[str, Any]:
    res = (doc.get("instance_type") or {}).get("resources") if isinstance(doc.get("instance_type"), dict) else None
    if res is None:
        res = doc.get("resources")  # an instance's offer
    return res if isinstance(res, dict) else {}


def _gpus(res: dict[str, Any]) -> list[dict[str, Any]]:
    return [g for g in res.get("gpus") or [] if isinstance(g, dict)]


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _run_families(
    counts: list[tuple[str, str, int, int, int, int]], pending: dict[tuple[str, str], int]
) -> list[Family]:
    """dstack's run counts by project and user, then its pending runs by project and run type."""
    total, terminated, failed, done = (Family(*spec) for spec in _RUN)
    for project, user, n, n_terminated, n_failed, n_done in counts:
        block = _RUN_LABELS((project, user))  # one block for the four series
        total.add(block, n)
        terminated.add(block, n_terminated)
        failed.add(block, n_failed)
        done.add(block, n_done)
    pending_f = Family(*_PENDING)
    for (project, run_type), n in pending.items():
        pending_f.add({"project_name": project, "run_type": run_type}, n)
    return [total, terminated, failed, done, pending_f]


async def render_metrics(ctx: Context, now: float) -> str:
    async with ctx.db.read() as conn:
        insts = await store.live_instances(conn)
        counts = await run_counts.series(conn)
        pending = await run_counts.pending(conn)
        live = await store.live_jobs(conn)
        queue = await store.queue_lengths(conn)
    inst_f = _families(_INSTANCE)
    duration, price, gpu_count = inst_f.values()
    for i in insts:
        res = _resources(i.offer)
        gpus = _gpus(res)
        series = _INSTANCE_LABELS(
            (
                i.project,
                i.fleet,
                i.fleet_id,
                i.name,
                i.id,
                str(i.offer.get("instance_type") or ("local" if i.offer else "")),
                "remote" if i.backend in ("local", "ssh") else i.backend,
                str(gpus[0].get("name") or "") if gpus else "",
            )
        )  # one block for the instance's three series
        duration.add(series, max(0.0, now - i.created_at))
        price.add(series, i.price)
        gpu_count.add(series, len(gpus))
    run_f = _run_families(counts, pending)
    job_f = _families(_JOB)
    for j in live:
        if not j.provisioning:
            continue  # dstack: a job without provisioning data has no series yet
        res = _resources(j.provisioning)
        gpus = _gpus(res)
        labels = {
            "dstack_project_name": j.project,
            "dstack_user_name": j.user,
            "dstack_run_name": j.run_name,
            "dstack_run_id": j.run_id,
            "dstack_job_name": j.job_name,
            "dstack_job_id": j.id,
            "dstack_job_num": str(j.job_num),
            "dstack_replica_num": str(j.replica_num),
            "dstack_run_type": j.run_type,
            "dstack_backend": str(j.provisioning.get("backend") or ""),
            "dstack_gpu": str(gpus[0].get("name") or "") if gpus else "",
        }
        key = tuple(labels.items())  # one tuple for the job's every series
        job_f["dstack_job_duration_seconds_total"].add(key, max(0.0, now - j.submitted_at))
        job_f["dstack_job_price_dollars_per_hour"].add(key, _num(j.provisioning.get("price")))
        job_f["dstack_job_gpu_count"].add(key, len(gpus))
        job_f["dstack_job_cpu_count"].add(key, _num(res.get("cpus")))
        job_f["dstack_job_memory_total_bytes"].add(key, _num(res.get("memory_mib")) * 2**20)
        p = j.point
        if p is None:
            continue
        job_f["dstack_job_cpu_time_seconds_total"].add(key, p.cpu_usage_micro / 1_000_000)
        job_f["dstack_job_memory_usage_bytes"].add(key, p.memory_usage_bytes)
        job_f["dstack_job_memory_working_set_bytes"].add(key, p.memory_working_set_bytes)
        if gpus:
            total = _num(gpus[0].get("memory_mib")) * 2**20
            for n, (util, used) in enumerate(zip(p.gpus_util_percent, p.gpus_memory_usage_bytes, strict=True)):
                gpu_labels = (*key, ("dstack_gpu_num", str(n)))
                job_f["dstack_job_gpu_usage_ratio"].add(gpu_labels, util / 100)
                job_f["dstack_job_gpu_memory_total_bytes"].add(gpu_labels, total)
                job_f["dstack_job_gpu_memory_usage_bytes"].add(gpu_labels, used)
    queue_f = Family(*_QUEUE)
    for (project, fleet), n in queue.items():
        queue_f.add({"project": project, "fleet": fleet}, n)
    from corral.services.quotas import metric_families

    quota_f = await metric_families(ctx)
    families = [*inst_f.values(), *run_f, *job_f.values(), queue_f, *quota_f, *ctx.telemetry.families()]
    return render(families)
