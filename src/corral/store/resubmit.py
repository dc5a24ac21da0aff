"""Job resubmission: a new submission (``submission_num + 1``) of every job of a replica whose run is
retried, in one transaction. The unique index on (run, replica, job, submission) makes it happen once
even when several replicas decide it at the same moment."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain import job_facts
from corral.domain.events import job_target
from corral.store.events import emit
from corral.store.runs import FINISHED_JOB_STATUSES
from corral.store.tables import jobs, runs


async def retry_specs(conn: AsyncConnection, job_ids: Sequence[str]) -> dict[str, Mapping[str, Any] | None]:
    """The ``retry`` of each job's spec (only the jobs that need a retry decision are read)."""
    if not job_ids:
        return {}
    rows = await conn.execute(sa.select(jobs.c.id, jobs.c.job_spec).where(jobs.c.id.in_(job_ids)))
    return {r.id: (orjson.loads(r.job_spec) or {}).get("retry") for r in rows}


async def dev_environment_jobs(conn: AsyncConnection, job_ids: Sequence[str]) -> frozenset[str]:
    """Of ``job_ids``, the jobs of dev environments (as their stored scheduling facts say; a job stored
    without them, or with facts of a version this code does not read, counts as a task's)."""
    if not job_ids:
        return frozenset()
    rows = await conn.execute(sa.select(jobs.c.id, jobs.c.scheduling_facts).where(jobs.c.id.in_(list(job_ids))))
    out = set()
    for r in rows:
        try:
            facts = job_facts.decode(r.scheduling_facts)
        except (ValueError, KeyError, TypeError):
            facts = None
        if facts is not None and facts.run_type == "dev-environment":
            out.add(r.id)
    return frozenset(out)


async def resubmit_replica(
    conn: AsyncConnection,
    run_id: str,
    replica_num: int,
    latest: Sequence[str],
    now: float,
    queued_at: float | None = None,
) -> bool:
    """Submit again the jobs whose latest submissions are ``latest`` (ids), once all of them have finished
    (``queued_at``: the time the new submissions keep their place in the queue by, a preempted replica's):
    while some still run, ask them to stop (they hold the capacity the new submissions need) and return
    False. If another replica did it first, the caller's transaction rolls back and ``Database.write`` raises
    :class:`~corral.store.errors.Conflict`."""
    rows = (await conn.execute(sa.select(jobs).where(jobs.c.id.in_(list(latest))))).all()
    if len(rows) != len(latest):
        return False
    still_active = [r.id for r in rows if r.status not in FINISHED_JOB_STATUSES]
    if still_active:
        await conn.execute(
            sa.update(jobs)
            .where(jobs.c.id.in_(still_active), jobs.c.stop_requested.is_(None))
            .values(stop_requested="resubmit")
        )
        return False
    number = max(r.submission_num for r in rows) + 1
    new_ids = {r.id: str(uuid.uuid4()) for r in rows}
    await conn.execute(
        sa.insert(jobs),
        [
            {
                "id": new_ids[r.id],
                "run_id": run_id,
                "project_id": r.project_id,
                "run_name": r.run_name,
                "job_num": r.job_num,
                "replica_num": replica_num,
                "job_name": r.job_name,
                "submission_num": number,
                "deployment_num": r.deployment_num,
                "submitted_at": now,
                "queued_at": queued_at,
                "last_processed_at": now,
                "status": "submitted",
                "job_spec": r.job_spec,
                "scheduling_facts": r.scheduling_facts,
                "priority": r.priority,
                "blocks": 1,
                "log_offset": 0,
                "ready": None if r.ready is None else False,  # a new service replica starts unready
            }
            for r in rows
        ],
    )
    for r in rows:
        target = job_target(r.project_id, new_ids[r.id], r.job_name, run_id)
        await emit(conn, "Job created on retry. Status: SUBMITTED", None, [target])
    # the new submissions may go to another fleet, as in dstack
    await conn.execute(sa.update(runs).where(runs.c.id == run_id).values(fleet_id=None, last_processed_at=now))
    return True
