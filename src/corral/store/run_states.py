"""What the runs worker reads of active runs: their statuses and their jobs', in two narrow queries; and the same of
one run, its row locked, in the transaction that has changed one of its jobs (:func:`lock_run`, :func:`with_jobs`)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store import direct, prebuilt
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
_JOB_COLUMNS = sa.select(
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
).outerjoin(instances, instances.c.id == jobs.c.instance_id)
_RUN_JOBS = _JOB_COLUMNS.where(jobs.c.run_id.in_(sa.bindparam("runs", expanding=True)))
#: The same two statements for a few ids, one parameter each (``prebuilt.in_ids``), by their number (and whether
#: settling): sent as compiled, on SQLite by its driver (``store/direct.py``); an expanding ``IN`` is rendered again
#: at every execution.
_SCOPED_OF: dict[tuple[int, bool], sa.Select[Any]] = {}
_JOBS_OF: dict[int, sa.Select[Any]] = {}


def _scoped(n: int, settling: bool) -> sa.Select[Any]:
    stmt = _SCOPED_OF.get((n, settling))
    if stmt is None:
        scoped = _RUNS.where(_ACTIVE, prebuilt.in_ids(runs.c.id, n))
        stmt = _SCOPED_OF[(n, settling)] = scoped.where(runs.c.status != "pending") if settling else scoped
    return stmt


def _jobs_of_runs(n: int) -> sa.Select[Any]:
    stmt = _JOBS_OF.get(n)
    if stmt is None:
        stmt = _JOBS_OF[n] = _JOB_COLUMNS.where(prebuilt.in_ids(jobs.c.run_id, n))
    return stmt


async def active_run_states(
    conn: AsyncConnection, *, settling: bool = False, run_ids: Collection[str] | None = None
) -> list[RunState]:
    """Every active run with its jobs' statuses, in two narrow queries. ``settling``: only the runs whose status
    may have to change (not ``pending`` ones, nor those only waiting in the queue: ``_IN_FLIGHT``). ``run_ids``:
    only those runs (the in-flight test is then skipped: reading them is cheaper than telling)."""
    if run_ids is not None:
        if not run_ids:
            return []
        scope = list(run_ids)
        if len(scope) <= prebuilt.LISTED:  # a pass woken for the runs of a few jobs: one parameter each
            run_rows = (await direct.execute(conn, _scoped(len(scope), settling), prebuilt.ids_params(scope))).all()
        else:
            stmt = _SCOPED_SETTLING if settling else _SCOPED
            run_rows = (await conn.execute(stmt, {"ids": scope})).all()
    else:
        run_rows = (await conn.execute(ACTIVE_RUNS.where(_IN_FLIGHT) if settling else ACTIVE_RUNS)).all()
    if not run_rows:
        return []
    ids = [r.id for r in run_rows]
    by_run: dict[str, list[JobState]] = {i: [] for i in ids}
    for chunk_start in range(0, len(ids), 500):
        chunk = ids[chunk_start : chunk_start + 500]
        if len(chunk) <= prebuilt.LISTED:
            rows = await direct.execute(conn, _jobs_of_runs(len(chunk)), prebuilt.ids_params(chunk))
        else:
            rows = await conn.execute(_RUN_JOBS, {"runs": chunk})
        for r in rows:
            by_run[r.run_id].append(_job_state(r))
    return [_run_state(r, tuple(by_run[r.id])) for r in run_rows]


def _job_state(r: Any) -> JobState:
    """A job's state from its row (SQLAlchemy's, or ``store/direct.py``'s: its columns by name alike)."""
    return JobState(
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


def _run_state(r: Any, run_jobs: tuple[JobState, ...]) -> RunState:
    return RunState(
        r.id,
        r.status,
        r.termination_reason,
        r.fleet_id,
        run_jobs,
        r.run_name,
        r.submitted_at,
        tuple(orjson.loads(r.schedule)) if r.schedule else None,
        r.next_triggered_at,
        bool(r.stop_on_master_done),
    )


# one run's statements, built once (run by SQLite's driver itself: ``store/direct.py``): its row by id (on
# Postgres locked, ``FOR NO KEY UPDATE`` -- the lock its UPDATE takes, so a job inserted for it meanwhile, its foreign
# key checked, does not wait -- unless another transaction holds it: ``SKIP LOCKED``), and its jobs
_RUN_BY_ID = _RUNS.where(runs.c.id == sa.bindparam("_id"))
_RUN_BY_ID_LOCKED = _RUN_BY_ID.with_for_update(key_share=True, skip_locked=True)
_JOBS_OF_RUN_BY_ID = _JOB_COLUMNS.where(jobs.c.run_id == sa.bindparam("_run"))


@dataclass(frozen=True)
class LockedRun:
    """A run's row as :func:`lock_run` read it, for :func:`with_jobs`."""

    #: Its row (SQLAlchemy's, or ``store/direct.py``'s).
    row: Any


async def lock_run(conn: AsyncConnection, run_id: str) -> LockedRun | None:
    """Read the run ``run_id``'s row, locked for the rest of the transaction (Postgres; SQLite's write transaction
    already excludes every other writer); None if there is no such run, or if another transaction holds its row.
    Called by a transaction that has written one of the run's jobs: it never waits for the run's row, since a
    user's stop writes the run's row and then its jobs' (and a resubmission a job's, then its run's), and waiting
    would deadlock with them. The caller leaves a run it could not lock to the runs worker."""
    stmt = _RUN_BY_ID if conn.dialect.name == "sqlite" else _RUN_BY_ID_LOCKED
    row = (await direct.execute(conn, stmt, {"_id": run_id})).first()
    return LockedRun(row) if row is not None else None


async def with_jobs(conn: AsyncConnection, run: LockedRun) -> RunState:
    """The run :func:`lock_run` read, with its jobs as this transaction sees them now."""
    rows = await direct.execute(conn, _JOBS_OF_RUN_BY_ID, {"_run": run.row.id})
    return _run_state(run.row, tuple(_job_state(r) for r in rows))
