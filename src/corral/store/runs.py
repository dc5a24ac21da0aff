"""Runs, jobs and logs. Two queries per page of runs (runs, then their jobs): no N+1."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace
from types import SimpleNamespace
from typing import Any, TypeVar

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.documents import LazyJSON
from corral.domain.gateways import Publication
from corral.domain.records import AGENT_LOG_SOURCE, JobRec, LogRec, RunRec
from corral.domain.statuses import FINISHED_JOB, FINISHED_RUN, JOB_STATUS, RUN_STATUS
from corral.store import deferred, direct, prebuilt, run_counts
from corral.store.events import tracked_update_by_id
from corral.store.tables import ACTIVE_RUN_WHERE, QUEUED_SQL, fleets, gateways, jobs, logs, projects, runs, users
from corral.store.unindexed import unindexed

FINISHED_RUN_STATUSES = FINISHED_RUN
FINISHED_JOB_STATUSES = FINISHED_JOB


def _loads(text: str | None) -> Any:
    return orjson.loads(text) if text else None


#: A record class -> how many fields it has, and whether it may be made by :func:`_record` (no ``__post_init__``).
_RECORDS: dict[type, tuple[int, bool]] = {}
R = TypeVar("R")


def _record(cls: type[R], values: dict[str, Any]) -> R:
    """The frozen record ``cls(**values)``, every field given, made without the ``__init__`` a frozen dataclass
    generates, which sets each field through ``object.__setattr__`` (a job's 32 fields: about 10 µs of CPU, more than
    reading its row; a page of runs makes hundreds). The same object: its fields in its ``__dict__``. A class with a
    ``__post_init__``, or ``values`` that leave a field out, get the constructor."""
    known = _RECORDS.get(cls)
    if known is None:
        known = _RECORDS[cls] = (len(fields(cls)), not hasattr(cls, "__post_init__"))  # type: ignore[arg-type]
    if len(values) != known[0] or not known[1]:
        return cls(**values)
    record: R = object.__new__(cls)
    record.__dict__.update(values)
    return record


def job_from_row(r: Any) -> JobRec:
    return _record(
        JobRec,
        dict(
            id=r.id,
            run_id=r.run_id,
            project_id=r.project_id,
            run_name=r.run_name,
            job_num=r.job_num,
            replica_num=r.replica_num,
            job_name=r.job_name,
            submission_num=r.submission_num,
            deployment_num=r.deployment_num,
            submitted_at=r.submitted_at,
            last_processed_at=r.last_processed_at,
            finished_at=r.finished_at,
            status=JOB_STATUS[r.status],
            status_message=r.status_message,
            termination_reason=r.termination_reason,
            termination_reason_message=r.termination_reason_message,
            exit_status=r.exit_status,
            job_spec=LazyJSON(r.job_spec),
            priority=r.priority,
            instance_id=r.instance_id,
            job_provisioning_data=_loads(r.job_provisioning_data),
            job_runtime_data=_loads(r.job_runtime_data),
            stop_requested=r.stop_requested,
            disconnected_at=r.disconnected_at,
            log_offset=r.log_offset,
            wait_deadline=r.wait_deadline,
            blocks=r.blocks,
            ssh_seen_at=getattr(r, "ssh_seen_at", None),
            ready=getattr(r, "ready", None),
            probes=tuple(_loads(getattr(r, "probes", None)) or ()),
            price=getattr(r, "price", None),
            placed_at=getattr(r, "placed_at", None),
        ),
    )


def _run(r: Any, run_jobs: Sequence[JobRec]) -> RunRec:
    return _record(
        RunRec,
        dict(
            id=r.id,
            project_id=r.project_id,
            project_name=r.project_name,
            user_name=r.user_name,
            run_name=r.run_name,
            submitted_at=r.submitted_at,
            last_processed_at=r.last_processed_at,
            status=RUN_STATUS[r.status],
            status_message=r.status_message,
            termination_reason=r.termination_reason,
            run_spec=LazyJSON(r.run_spec),
            priority=r.priority,
            fleet_id=r.fleet_id,
            fleet_name=r.fleet_name,
            deployment_num=r.deployment_num,
            deleted=r.deleted,
            jobs=tuple(run_jobs),
            next_triggered_at=getattr(r, "next_triggered_at", None),
            gateway=_publication(r),
        ),
    )


def _publication(r: Any) -> Publication | None:
    """Where the run is published, when its gateway is still there."""
    name = getattr(r, "gateway_name", None)
    if name is None:
        return None
    certificate = orjson.loads(r.gateway_configuration).get("certificate")
    return Publication(name, r.gateway_domain or "", certificate is not None)


#: What a run's record holds of its row (``_run``) and a job's (``job_from_row``): a read of runs and jobs for their
#: records reads these columns alone, not the documents and leases the workers keep beside them.
_RUN_COLUMNS = tuple(
    runs.c[name]
    for name in (
        "id", "project_id", "run_name", "submitted_at", "last_processed_at", "status", "status_message",
        "termination_reason", "run_spec", "priority", "fleet_id", "deployment_num", "deleted", "next_triggered_at",
    )
)  # fmt: skip
_JOB_COLUMNS = tuple(
    jobs.c[name]
    for name in (
        "id", "run_id", "project_id", "run_name", "job_num", "replica_num", "job_name", "submission_num",
        "deployment_num", "submitted_at", "last_processed_at", "finished_at", "status", "status_message",
        "termination_reason", "termination_reason_message", "exit_status", "job_spec", "priority", "instance_id",
        "job_provisioning_data", "job_runtime_data", "stop_requested", "disconnected_at", "log_offset",
        "wait_deadline", "blocks", "ssh_seen_at", "ready", "probes", "price", "placed_at",
    )
)  # fmt: skip


def _run_select() -> sa.Select[Any]:
    return (
        sa.select(
            *_RUN_COLUMNS,
            projects.c.name.label("project_name"),
            users.c.name.label("user_name"),
            fleets.c.name.label("fleet_name"),
            gateways.c.name.label("gateway_name"),
            gateways.c.wildcard_domain.label("gateway_domain"),
            gateways.c.configuration.label("gateway_configuration"),
        )
        .join(projects, projects.c.id == runs.c.project_id)
        .join(users, users.c.id == runs.c.user_id)
        .outerjoin(fleets, fleets.c.id == runs.c.fleet_id)
        .outerjoin(gateways, gateways.c.id == runs.c.gateway_id)
    )


#: Statements built once (``store/prebuilt.py`` says why): a run and a job by ``:_id``.
_RUN_BY_ID = _run_select().where(runs.c.id == sa.bindparam("_id"))
_JOB_BY_ID = sa.select(jobs).where(jobs.c.id == sa.bindparam("_id"))
#: A project's run by ``:_id``, and its live run named ``:run_name`` (every apply of a named run reads it).
_RUN_OF_PROJECT = _run_select().where(runs.c.project_id == sa.bindparam("project_id"), runs.c.id == sa.bindparam("_id"))
_RUN_NAMED = _run_select().where(
    runs.c.project_id == sa.bindparam("project_id"),
    runs.c.run_name == sa.bindparam("run_name"),
    runs.c.deleted == sa.false(),
)

#: Lists of ids longer than ``prebuilt.LISTED`` (a page of runs: up to 100) are bound one parameter each too, padded
#: with their last id to the next of these lengths (a statement per length, sent as compiled: an expanding ``IN`` is
#: rendered again at every execution); the runs and jobs of more ids are read in chunks of the last.
_PADDED = (32, 64, 128)


def _listed(ids: Sequence[str]) -> tuple[int | None, dict[str, Any]]:
    """``ids`` as the parameters of :func:`_in_ids`'s condition, and their number (None: more than ``_PADDED``
    holds, an expanding parameter)."""
    n = len(ids)
    if n <= prebuilt.LISTED:
        return n, prebuilt.ids_params(ids)
    size = next((size for size in _PADDED if size >= n), None)
    if size is None:
        return None, {"_in": list(ids)}
    return size, prebuilt.ids_params([*ids, *(ids[-1] for _ in range(size - n))])


def _in_ids(column: sa.ColumnElement[Any], n: int | None) -> sa.ColumnElement[bool]:
    """``column IN (...)`` of :func:`_listed`'s parameters (``prebuilt.in_ids``'s, typed as ``column``)."""
    if n is None:
        return column.in_(sa.bindparam("_in", expanding=True, type_=column.type))
    return column.in_([sa.bindparam(f"_in_{i}", type_=column.type) for i in range(n)])


def _chunks(ids: Sequence[str]) -> list[tuple[int, dict[str, Any]]]:
    """``ids`` in chunks that :func:`_listed` binds one parameter each: (their number, the parameters)."""
    out = []
    for start in range(0, len(ids), _PADDED[-1]):
        n, params = _listed(ids[start : start + _PADDED[-1]])
        assert n is not None
        out.append((n, params))
    return out


#: The same for ids by their number (:func:`_listed`): the runs, their jobs, and the latest ``:_subs`` submissions
#: of each of their jobs (a window over the jobs of the runs).
_RUNS_OF: dict[int, sa.Select[Any]] = {}
_JOBS_OF: dict[int, sa.Select[Any]] = {}
_LATEST_JOBS_OF: dict[int, sa.Select[Any]] = {}


def _runs_of(n: int) -> sa.Select[Any]:
    stmt = _RUNS_OF.get(n)
    if stmt is None:
        stmt = _RUNS_OF[n] = _run_select().where(_in_ids(runs.c.id, n))
    return stmt


def _jobs_of_runs(n: int) -> sa.Select[Any]:
    stmt = _JOBS_OF.get(n)
    if stmt is None:
        stmt = _JOBS_OF[n] = sa.select(*_JOB_COLUMNS).where(_in_ids(jobs.c.run_id, n))
    return stmt


def _latest_jobs_of_runs(n: int) -> sa.Select[Any]:
    stmt = _LATEST_JOBS_OF.get(n)
    if stmt is None:
        rank = (
            sa.func.row_number()
            .over(
                partition_by=(jobs.c.run_id, jobs.c.replica_num, jobs.c.job_num),
                order_by=jobs.c.submission_num.desc(),
            )
            .label("rnk")
        )
        sub = sa.select(*_JOB_COLUMNS, rank).where(_in_ids(jobs.c.run_id, n)).subquery()
        stmt = sa.select(*(sub.c[c.name] for c in _JOB_COLUMNS)).where(
            sub.c.rnk <= sa.bindparam("_subs", type_=sa.Integer)
        )
        _LATEST_JOBS_OF[n] = stmt
    return stmt


#: The jobs in ``:statuses`` (of the run ``:run_id``, of ``:ids``), oldest first (``list_jobs``). Jobs of ``:ids``
#: are found by their ids, the status checked on each row (``unindexed``): SQLite's planner, which has no statistics,
#: would read ``ix_jobs_status_queue`` for them, every active job, to find a few.
_JOBS_IN = sa.select(jobs).where(jobs.c.status.in_(sa.bindparam("statuses", expanding=True)))
_JOBS_OF_IDS = sa.select(jobs).where(
    jobs.c.id.in_(sa.bindparam("ids", expanding=True)),
    unindexed(jobs.c.status).in_(sa.bindparam("statuses", expanding=True)),
)
_LISTED_JOBS = {
    (by_ids, by_run): (
        (_JOBS_OF_IDS if by_ids else _JOBS_IN)
        .where(*((jobs.c.run_id == sa.bindparam("run_id"),) if by_run else ()))
        .order_by(jobs.c.submitted_at)
    )
    for by_ids in (False, True)
    for by_run in (False, True)
}


async def _jobs_for(
    conn: AsyncConnection, run_ids: Sequence[str], submissions_limit: int | None
) -> dict[str, list[JobRec]]:
    out: dict[str, list[JobRec]] = {i: [] for i in run_ids}
    if not run_ids or submissions_limit == 0:
        return out
    rows: list[Any] = []
    for n, params in _chunks(run_ids):
        if submissions_limit is None:
            rows += await direct.execute(conn, _jobs_of_runs(n), params)
        else:  # only the latest ``submissions_limit`` submissions of each (replica, job): a window over the index
            rows += await direct.execute(conn, _latest_jobs_of_runs(n), {**params, "_subs": submissions_limit})
    for r in rows:
        out[r.run_id].append(job_from_row(r))
    for lst in out.values():
        lst.sort(key=lambda j: (j.replica_num, j.job_num, j.submission_num))
    return out


#: The statements of a page of run keys, built once per shape (which filters, how many projects: ``_listed``), their
#: values bound: ``_in_*`` (or ``_in``) the projects, ``_user``, ``_repo``, ``_limit``, ``_after_at``, ``_after_id``.
_KEYS: dict[tuple[object, ...], sa.Select[Any]] = {}


def _keys_statement(
    projects: int | None,
    only_active: bool,
    by_user: bool,
    by_repo: bool,
    limited: bool,
    ascending: bool,
    after: bool,
) -> sa.Select[Any]:
    """``projects``: -1 every project, else the number of their parameters (None: an expanding one)."""
    shape = (projects, only_active, by_user, by_repo, limited, ascending, after)
    q = _KEYS.get(shape)
    if q is not None:
        return q
    q = sa.select(runs.c.id, runs.c.status, runs.c.last_processed_at).where(runs.c.deleted == sa.false())
    if projects != -1:
        q = q.where(_in_ids(runs.c.project_id, projects))
    if only_active:
        q = q.where(sa.text(ACTIVE_RUN_WHERE))  # the active runs' partial indexes
    if by_user:
        q = q.where(runs.c.user_id == sa.bindparam("_user", type_=runs.c.user_id.type))
    if by_repo:
        q = q.where(runs.c.repo_id == sa.bindparam("_repo", type_=runs.c.repo_id.type))
    if after:
        cmp = sa.tuple_(runs.c.submitted_at, runs.c.id)
        bound = sa.tuple_(
            sa.bindparam("_after_at", type_=runs.c.submitted_at.type), sa.bindparam("_after_id", type_=runs.c.id.type)
        )
        q = q.where(cmp > bound if ascending else cmp < bound)
    order = (runs.c.submitted_at, runs.c.id)
    q = q.order_by(*(c.asc() if ascending else c.desc() for c in order))
    if limited:
        q = q.limit(sa.bindparam("_limit", type_=sa.Integer))
    _KEYS[shape] = q
    return q


@dataclass(frozen=True)
class RunKey:
    """Enough of a run to tell whether a cached rendering of it is still current."""

    id: str
    status: str
    last_processed_at: float


async def list_run_keys(
    conn: AsyncConnection,
    project_ids: Sequence[str] | None,
    only_active: bool = False,
    user_id: str | None = None,
    repo_id: str | None = None,
    limit: int | None = 100,
    ascending: bool = False,
    after: tuple[float, str] | None = None,
) -> list[RunKey]:
    """A page of runs (filters and keyset order as dstack's runs/list), as keys only (one narrow indexed query,
    on SQLite run by its driver: ``store/direct.py``)."""
    if project_ids is not None and not project_ids:
        return []  # no project to list
    q, values = _keys_query(project_ids, only_active, user_id, repo_id, limit, ascending, after)
    return [RunKey(r.id, r.status, r.last_processed_at) for r in await direct.execute(conn, q, values)]


def _keys_query(
    project_ids: Sequence[str] | None,
    only_active: bool,
    user_id: str | None,
    repo_id: str | None,
    limit: int | None,
    ascending: bool,
    after: tuple[float, str] | None,
) -> tuple[sa.Select[Any], dict[str, Any]]:
    """:func:`list_run_keys`'s statement (built once per shape) and its values."""
    projects, values = (-1, {}) if project_ids is None else _listed(project_ids)
    if user_id is not None:
        values["_user"] = user_id
    if repo_id is not None:
        values["_repo"] = repo_id
    if after is not None:
        values["_after_at"], values["_after_id"] = after
    if limit is not None:
        values["_limit"] = limit
    shape = (projects, only_active, user_id is not None, repo_id is not None, limit is not None, ascending)
    return _keys_statement(*shape, after is not None), values


def run_keys_query(
    project_ids: Sequence[str] | None,
    only_active: bool = False,
    user_id: str | None = None,
    repo_id: str | None = None,
    limit: int | None = 100,
    ascending: bool = False,
    after: tuple[float, str] | None = None,
) -> sa.Select[Any]:
    """The statement of :func:`list_run_keys`, its values bound."""
    q, values = _keys_query(project_ids, only_active, user_id, repo_id, limit, ascending, after)
    return q.params(values)


async def runs_by_ids(
    conn: AsyncConnection, ids: Sequence[str], include_jobs: bool = True, submissions_limit: int | None = None
) -> dict[str, RunRec]:
    if not ids:
        return {}
    rows: list[Any] = []
    for n, params in _chunks(ids):
        rows += await direct.execute(conn, _runs_of(n), params)
    by_run = await _jobs_for(conn, [r.id for r in rows], submissions_limit) if include_jobs else {}
    return {r.id: _run(r, by_run.get(r.id, [])) for r in rows}


async def get_run(
    conn: AsyncConnection, project_id: str, run_name: str | None = None, run_id: str | None = None
) -> RunRec | None:
    if run_id is not None:
        row = (await direct.execute(conn, _RUN_OF_PROJECT, {"project_id": project_id, "_id": run_id})).first()
    else:
        row = (await direct.execute(conn, _RUN_NAMED, {"project_id": project_id, "run_name": run_name})).first()
    if row is None:
        return None
    return _run(row, (await _jobs_for(conn, [row.id], None))[row.id])


async def get_run_by_id(conn: AsyncConnection, run_id: str) -> RunRec | None:
    row = (await direct.execute(conn, _RUN_BY_ID, {"_id": run_id})).first()
    if row is None:
        return None
    return _run(row, (await _jobs_for(conn, [row.id], None))[row.id])


_INSERT_RUN = sa.insert(runs)  # parameters at execute time: one cached compiled statement


async def insert_run(conn: AsyncConnection, values: dict[str, Any]) -> None:
    """Insert a run, counted by its status in the same transaction (``store/run_counts.py``)."""
    await direct.insert(conn, runs, _INSERT_RUN, [{"deleted": False, **values}])
    await run_counts.runs_inserted(conn, [(values["project_id"], values["user_id"], values["status"])])


async def update_run(
    conn: AsyncConnection,
    run_id: str,
    values: dict[str, Any],
    expect_status: Sequence[str] | None = None,
    actor_id: str | None = None,
) -> bool:
    """Change a run; a status change is recorded as an event (by ``actor_id``, None: the system)."""
    return await tracked_update_by_id(conn, runs, run_id, values, expect_status, actor_id)


_INSERT_JOBS = sa.insert(jobs)


async def insert_jobs(conn: AsyncConnection, values: Sequence[dict[str, Any]]) -> None:
    """Several jobs in one statement (a multi-node run's)."""
    await direct.insert(conn, jobs, _INSERT_JOBS, [{"log_offset": 0, **v} for v in values])


def new_run_rec(
    run_values: dict[str, Any],
    job_values: Sequence[dict[str, Any]],
    project_name: str,
    user_name: str,
    gateway: Publication | None = None,
) -> RunRec:
    """The record of a run just inserted with ``run_values`` and ``job_values`` (as a read would give it; its
    ``gateway``: where it is published, as the apply found it)."""
    defaults = {
        "finished_at": None,
        "status_message": None,
        "termination_reason": None,
        "termination_reason_message": None,
        "exit_status": None,
        "instance_id": None,
        "job_provisioning_data": None,
        "job_runtime_data": None,
        "stop_requested": None,
        "disconnected_at": None,
        "log_offset": 0,
        "wait_deadline": None,
        "ssh_seen_at": None,
    }
    run_jobs = [job_from_row(SimpleNamespace(**{**defaults, **v})) for v in job_values]
    row = SimpleNamespace(**run_values, project_name=project_name, user_name=user_name, fleet_name=None, deleted=False)
    rec = _run(row, run_jobs)  # its gateway None: the row names none
    return rec if gateway is None else replace(rec, gateway=gateway)


async def update_job(
    conn: AsyncConnection,
    job_id: str,
    values: dict[str, Any],
    expect_status: Sequence[str] | None = None,
    actor_id: str | None = None,
) -> bool:
    """Change a job; a status change is recorded as an event (with its termination reason and message)."""
    return await tracked_update_by_id(conn, jobs, job_id, values, expect_status, actor_id)


async def list_jobs(
    conn: AsyncConnection, statuses: Sequence[str], run_id: str | None = None, ids: Iterable[str] | None = None
) -> list[JobRec]:
    """The jobs in ``statuses`` (of run ``run_id``, of ``ids``), oldest first."""
    by_run = {"run_id": run_id} if run_id is not None else {}
    if ids is None:
        q = _LISTED_JOBS[(False, run_id is not None)]
        return [job_from_row(r) for r in await conn.execute(q, {"statuses": list(statuses), **by_run})]
    listed = list(ids)
    if not listed:
        return []
    if len(listed) <= prebuilt.LISTED:  # a pass over the jobs a placement just handed over: a few
        q = _jobs_listed(tuple(statuses), len(listed), run_id is not None)
        rows: Iterable[Any] = await direct.execute(conn, q, {**prebuilt.ids_params(listed), **by_run})
    else:
        q = _LISTED_JOBS[(True, run_id is not None)]
        rows = await conn.execute(q, {"ids": listed, "statuses": list(statuses), **by_run})
    return [job_from_row(r) for r in rows]


_JOBS_LISTED: dict[tuple[tuple[str, ...], int, bool], sa.Select[Any]] = {}


def _jobs_listed(statuses: tuple[str, ...], n: int, by_run: bool) -> sa.Select[Any]:
    """:func:`list_jobs`'s statement for ``n`` ids, its statuses literal values (sent as compiled), checked on each
    row as in ``_JOBS_OF_IDS``."""
    key = (statuses, n, by_run)
    stmt = _JOBS_LISTED.get(key)
    if stmt is None:
        literal = [sa.literal(s, jobs.c.status.type) for s in statuses]
        q = sa.select(jobs).where(unindexed(jobs.c.status).in_(literal), _in_ids(jobs.c.id, n))
        if by_run:
            q = q.where(jobs.c.run_id == sa.bindparam("run_id"))
        stmt = _JOBS_LISTED[key] = q.order_by(jobs.c.submitted_at)
    return stmt


async def get_job(conn: AsyncConnection, job_id: str) -> JobRec | None:
    row = (await conn.execute(_JOB_BY_ID, {"_id": job_id})).first()
    return job_from_row(row) if row is not None else None


async def mark_runs_deleted(conn: AsyncConnection, run_ids: Sequence[str]) -> None:
    await conn.execute(sa.update(runs).where(runs.c.id.in_(run_ids)).values(deleted=True))


_INSERT_LOGS = sa.insert(logs)


#: The same on SQLite, run by the driver itself (plain values: SQLAlchemy's execution path cost more than it).
_LOG_COLUMNS = ("job_id", "timestamp", "source", "message")
_INSERT_LOGS_SQLITE = f"INSERT INTO logs ({', '.join(logs.c[c].name for c in _LOG_COLUMNS)}) VALUES (?, ?, ?, ?)"


async def append_logs(conn: AsyncConnection, job_id: str, entries: Sequence[tuple[float, int, bytes]]) -> None:
    if not entries:
        return
    if conn.dialect.name == "sqlite":
        await deferred.driver_executemany(
            conn, _INSERT_LOGS_SQLITE, [(job_id, round(t, 6), s, m) for t, s, m in entries]
        )
        return
    await conn.execute(
        _INSERT_LOGS, [{"job_id": job_id, "timestamp": round(t, 6), "source": s, "message": m} for t, s, m in entries]
    )


async def read_logs(
    conn: AsyncConnection,
    job_id: str,
    after_id: int | None,
    limit: int,
    descending: bool = False,
    start_time: float | None = None,
    end_time: float | None = None,
    diagnose: bool = False,
) -> list[LogRec]:
    """A page of the job's output, or (``diagnose``) of the agent's own lines about it."""
    agent = logs.c.source == AGENT_LOG_SOURCE
    q = sa.select(logs.c.id, logs.c.timestamp, logs.c.source, logs.c.message).where(
        logs.c.job_id == job_id, agent if diagnose else sa.not_(agent)
    )
    if after_id is not None:
        q = q.where(logs.c.id < after_id if descending else logs.c.id > after_id)
    # Times have microsecond resolution on the wire; ``start_time`` is exclusive (as dstack's).
    if start_time is not None:
        q = q.where(logs.c.timestamp > start_time + 5e-7)
    if end_time is not None:
        q = q.where(logs.c.timestamp <= end_time + 5e-7)
    q = q.order_by(logs.c.id.desc() if descending else logs.c.id.asc()).limit(limit)
    return [LogRec(r.id, r.timestamp, r.source, bytes(r.message)) for r in await conn.execute(q)]


#: How many waiting jobs of project ``:project`` come before one of priority ``:priority`` submitted at ``:at`` with id
#: ``:_id`` (``queue_position``; built once), counted from ``ix_jobs_queue_ahead`` alone (the queue's terms spelled
#: as its predicate): a step per job ahead, in the index, not a read of each one's row.
_AHEAD = (
    sa.select(sa.func.count())
    .select_from(jobs)
    .where(
        jobs.c.project_id == sa.bindparam("project", type_=jobs.c.project_id.type),
        sa.text(QUEUED_SQL),
        sa.or_(
            jobs.c.priority > sa.bindparam("priority", type_=jobs.c.priority.type),
            sa.and_(
                jobs.c.priority == sa.bindparam("priority", type_=jobs.c.priority.type),
                sa.tuple_(jobs.c.submitted_at, jobs.c.id)
                < sa.tuple_(
                    sa.bindparam("at", type_=jobs.c.submitted_at.type), sa.bindparam("_id", type_=jobs.c.id.type)
                ),
            ),
        ),
    )
)


async def queue_position(conn: AsyncConnection, job: JobRec) -> int:
    """1-based place of a waiting job in its project's queue (priority, then age), computed on read."""
    params = {"project": job.project_id, "priority": job.priority, "at": job.submitted_at, "_id": job.id}
    return int((await direct.execute(conn, _AHEAD, params)).scalar_one()) + 1


async def leased_elsewhere(conn: AsyncConnection, job_ids: Sequence[str], owner: str, now: float) -> set[str]:
    """The jobs among ``job_ids`` whose live lease belongs to another replica."""
    if not job_ids:
        return set()
    q = sa.select(jobs.c.id).where(
        jobs.c.id.in_(job_ids), jobs.c.lock_owner.is_not(None), jobs.c.lock_owner != owner, jobs.c.lock_expires_at > now
    )
    return {r.id for r in await conn.execute(q)}


#: The agent offset of a job's stored output, while ``:_token`` holds its lease (built once: store/prebuilt.py).
_LOG_OFFSET = (
    sa.update(jobs)
    .where(jobs.c.id == sa.bindparam("_id"), jobs.c.lock_token == sa.bindparam("_token"))
    .values(log_offset=sa.bindparam("_offset"), disconnected_at=None)
)


async def append_logs_guarded(
    conn: AsyncConnection, job_id: str, token: str, entries: Sequence[tuple[float, int, bytes]], next_offset: int
) -> bool:
    """Store output and the agent offset after it -- only while ``token`` still holds the job's lease,
    so a replica that lost the lease never duplicates lines. On SQLite both go by its driver (``store/direct.py``)."""
    res = await direct.execute(conn, _LOG_OFFSET, {"_id": job_id, "_token": token, "_offset": next_offset})
    if res.rowcount == 0:
        return False
    await append_logs(conn, job_id, entries)
    return True
