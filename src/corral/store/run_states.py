"""What the runs worker reads of active runs: their statuses and their jobs', in two narrow queries."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store.tables import ACTIVE_RUN_WHERE, instances, jobs, runs


@dataclass(frozen=True)
class JobState:
    replica_num: int
    job_num: int
    submission_num: int
    status: str
    status_message: str | None
    instance_fleet_id: str | None
    id: str
    termination_reason: str | None
    #: It was placed on an instance (dstack: it has provisioning data; the job keeps its instance id).
    provisioned: bool
    submitted_at: float
    finished_at: float | None
    #: A service replica: whether the proxy routes to it (None: not a service replica) ...
    ready: bool | None = None
    #: ... and when it was last seen ready.
    ready_at: float | None = None
    #: A service replica the scaler removed (``stop_requested = scaled_down``): never submitted again.
    retired: bool = False
    #: Stopped to make room for another run (``stop_requested = preempted``): always submitted again.
    preempted: bool = False


@dataclass(frozen=True)
class RunState:
    """What the runs worker needs of an active run: statuses only, no documents to parse."""

    id: str
    status: str
    termination_reason: str | None
    fleet_id: str | None
    jobs: tuple[JobState, ...]
    #: The run's name (for log lines).
    name: str = ""
    submitted_at: float = 0.0
    #: ``schedule``'s crons (None: not a scheduled run).
    schedule: tuple[str, ...] | None = None
    #: A scheduled run's trigger: the one it waits for (pending), or the one that fired it.
    next_triggered_at: float | None = None
    #: ``stop_criteria: master-done``: it ends done once a master job (``job_num`` 0) is done.
    stop_on_master_done: bool = False


#: A run only waiting in the queue: ``submitted``, and every job of it (every submission) a ``submitted`` task
#: job nobody asked to stop. Its status cannot change before one of its jobs does, so the runs worker leaves it
#: out: a pass costs what is in flight, not the length of the queue.
_IN_FLIGHT = sa.or_(
    runs.c.status.notin_(("submitted", "pending")),
    sa.and_(
        runs.c.status == "submitted",
        sa.exists().where(
            jobs.c.run_id == runs.c.id,
            sa.or_(jobs.c.status != "submitted", jobs.c.ready.is_not(None), jobs.c.stop_requested.is_not(None)),
        ),
    ),
)


_RUNS = sa.select(
    runs.c.id,
    runs.c.status,
    runs.c.termination_reason,
    runs.c.fleet_id,
    runs.c.run_name,
    runs.c.submitted_at,
    runs.c.schedule,
    runs.c.next_triggered_at,
    runs.c.stop_on_master_done,
)
#: Spelled as the active runs' partial index's predicate, so that a pass reads that index, not the history.
_ACTIVE = sa.and_(sa.text(ACTIVE_RUN_WHERE), runs.c.deleted == sa.false())
#: Every active run (a whole pass's first query).
ACTIVE_RUNS = _RUNS.where(_ACTIVE)
# a scoped pass's statements, built once (``store/prebuilt.py`` says why): the runs of ``:ids`` still active
_SCOPED = _RUNS.where(_ACTIVE, runs.c.id.in_(sa.bindparam("ids", expanding=True)))
_SCOPED_SETTLING = _SCOPED.where(runs.c.status != "pending")
#: The jobs of the runs ``:runs``, with the fleet of the instance each is on.
_RUN_JOBS = (
    sa.select(
        jobs.c.run_id,
        jobs.c.replica_num,
        jobs.c.job_num,
        jobs.c.submission_num,
        jobs.c.status,
        jobs.c.status_message,
        instances.c.fleet_id,
        jobs.c.id,
        jobs.c.termination_reason,
        jobs.c.instance_id.is_not(None).label("provisioned"),
        jobs.c.submitted_at,
        jobs.c.finished_at,
        jobs.c.ready,
        jobs.c.ready_at,
        jobs.c.stop_requested,
    )
    .outerjoin(instances, instances.c.id == jobs.c.instance_id)
    .where(jobs.c.run_id.in_(sa.bindparam("runs", expanding=True)))
)


async def active_run_states(
    conn: AsyncConnection, *, settling: bool = False, run_ids: Collection[str] | None = None
) -> list[RunState]:
    """Every active run with its jobs' statuses, in two narrow queries. ``settling``: only the runs whose status
    may have to change (not ``pending`` ones, nor those only waiting in the queue: ``_IN_FLIGHT``). ``run_ids``:
    only those runs (the in-flight test is then skipped: reading them is cheaper than telling)."""
    if run_ids is not None:
        if not run_ids:
            return []
        stmt = _SCOPED_SETTLING if settling else _SCOPED
        run_rows = (await conn.execute(stmt, {"ids": list(run_ids)})).all()
    else:
        run_rows = (await conn.execute(ACTIVE_RUNS.where(_IN_FLIGHT) if settling else ACTIVE_RUNS)).all()
    if not run_rows:
        return []
    ids = [r.id for r in run_rows]
    by_run: dict[str, list[JobState]] = {i: [] for i in ids}
    for chunk_start in range(0, len(ids), 500):
        chunk = ids[chunk_start : chunk_start + 500]
        for r in await conn.execute(_RUN_JOBS, {"runs": chunk}):
            by_run[r.run_id].append(
                JobState(
                    r.replica_num,
                    r.job_num,
                    r.submission_num,
                    r.status,
                    r.status_message,
                    r.fleet_id,
                    r.id,
                    r.termination_reason,
                    bool(r.provisioned),
                    r.submitted_at,
                    r.finished_at,
                    r.ready,
                    r.ready_at,
                    r.stop_requested == "scaled_down",
                    r.stop_requested == "preempted",
                )
            )
    return [
        RunState(
            r.id,
            r.status,
            r.termination_reason,
            r.fleet_id,
            tuple(by_run[r.id]),
            r.run_name,
            r.submitted_at,
            tuple(orjson.loads(r.schedule)) if r.schedule else None,
            r.next_triggered_at,
            bool(r.stop_on_master_done),
        )
        for r in run_rows
    ]
