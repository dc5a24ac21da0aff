"""Fleets and instances: reads, and the writes that are not capacity decisions.

Capacity (a job taking blocks of an instance, a new instance reserved under ``nodes.max``) is written
only by ``plan_apply``; here are fleet creation/updates, instance lifecycle (provisioned, released,
terminating, terminated) and reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.documents import json_default
from corral.domain.events import instance_target
from corral.domain.records import FleetRec, IdleClock, InstanceQuery, InstanceRec
from corral.domain.statuses import FLEET_STATUS, INSTANCE_STATUS, READY_INSTANCE, UNFINISHED_JOB
from corral.store import direct, prebuilt
from corral.store.errors import Conflict
from corral.store.events import emit, tracked_update, tracked_update_by_id
from corral.store.exports import fleets_imported_by
from corral.store.tables import COUNTED_INSTANCE_SQL, fleets, instances, jobs, projects

LIVE_JOB_STATUSES = UNFINISHED_JOB


def _loads(text: str | None) -> Any:
    return orjson.loads(text) if text else None


def _plain(result: sa.CursorResult[Any]) -> list[SimpleNamespace]:
    """The rows of ``result`` as plain namespaces: a result row's attributes cost about 0.4 µs each to read
    (measured), and a list converts hundreds of rows of some 28 columns each."""
    keys = tuple(result.keys())
    return [SimpleNamespace(**dict(zip(keys, r, strict=True))) for r in result]


def instance_from_row(row: Any, project_name: str, fleet_name: str | None) -> InstanceRec:
    return InstanceRec(
        id=row.id,
        project_id=row.project_id,
        project_name=project_name,
        fleet_id=row.fleet_id,
        fleet_name=fleet_name,
        name=row.name,
        instance_num=row.instance_num,
        status=INSTANCE_STATUS[row.status],
        unreachable=row.unreachable,
        backend=row.backend,
        region=row.region,
        price=row.price,
        offer=_loads(row.offer),
        total_blocks=row.total_blocks,
        busy_blocks=row.busy_blocks,
        hostname=row.hostname,
        agent=_loads(row.agent),
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        last_job_finished_at=row.last_job_finished_at,
        idle_duration=row.idle_duration,
        termination_reason=row.termination_reason,
        termination_reason_message=row.termination_reason_message,
        gateway_id=row.gateway_id,
        status_message=row.status_message,
    )


def _fleet(row: Any, project_name: str, insts: Sequence[InstanceRec]) -> FleetRec:
    return FleetRec(
        id=row.id,
        project_id=row.project_id,
        project_name=project_name,
        name=row.name,
        created_at=row.created_at,
        status=FLEET_STATUS[row.status],
        status_message=row.status_message,
        spec=orjson.loads(row.spec),
        deleted=row.deleted,
        instances=tuple(insts),
    )


# built once (``store/prebuilt.py`` says why): the instances of the fleets ``:ids``, and those of them that count
# (not terminated; and an SSH fleet's failed hosts, listed with their errors until the fleet is applied again:
# ``COUNTED_INSTANCE_SQL``, the predicate of ``ix_instances_live_fleet``, which they are read from in its order, so
# that a fleet's terminated instances are never read; ordered by ``instance_num`` alone, SQLite would take
# ``ix_instances_fleet_status``)
_INSTANCES_OF = (
    sa.select(instances)
    .where(instances.c.fleet_id.in_(sa.bindparam("ids", expanding=True)), instances.c.deleted == sa.false())
    .order_by(instances.c.fleet_id, instances.c.instance_num)
)
_ACTIVE_INSTANCES_OF = (
    sa.select(instances)
    .where(instances.c.fleet_id.in_(sa.bindparam("ids", expanding=True)), sa.text(COUNTED_INSTANCE_SQL))
    .order_by(instances.c.fleet_id, instances.c.instance_num)
)
#: Every fleet not deleted, newest first, with its project's name (what the scheduler's pass reads).
_LIVE_FLEETS = (
    sa.select(fleets, projects.c.name.label("project_name"))
    .join(projects, projects.c.id == fleets.c.project_id)
    .where(fleets.c.deleted == sa.false())
    .order_by(fleets.c.created_at.desc(), fleets.c.id.desc())
)


async def _instances_of(
    conn: AsyncConnection, fleet_rows: Sequence[Any], project_names: dict[str, str], only_active: bool
) -> dict[str, list[InstanceRec]]:
    ids = [r.id for r in fleet_rows]
    out: dict[str, list[InstanceRec]] = {i: [] for i in ids}
    if not ids:
        return out
    names = {r.id: r.name for r in fleet_rows}
    q = _ACTIVE_INSTANCES_OF if only_active else _INSTANCES_OF
    for r in _plain(await conn.execute(q, {"ids": ids})):
        out[r.fleet_id].append(instance_from_row(r, project_names[r.project_id], names[r.fleet_id]))
    return out


async def list_fleets(
    conn: AsyncConnection,
    project_ids: Sequence[str] | None,
    include_deleted: bool = False,
    limit: int | None = None,
    ascending: bool = False,
    after: tuple[float, str] | None = None,
    include_imported: bool = False,
    statuses: Sequence[str] | None = None,
) -> list[FleetRec]:
    """The fleets of ``project_ids`` (None: every project's), and with ``include_imported`` those exported to
    them, as dstack's global ``fleets/list`` adds them (``list_projects_fleet_models``)."""
    plain = statuses is None and after is None and not ascending and limit is None
    if project_ids is None and not include_deleted and plain:
        rows = _plain(await conn.execute(_LIVE_FLEETS))
    else:
        q = sa.select(fleets, projects.c.name.label("project_name")).join(
            projects, projects.c.id == fleets.c.project_id
        )
        if project_ids is not None:
            own = fleets.c.project_id.in_(project_ids)
            imported = include_imported and len(project_ids) > 0  # a caller in no project imports nothing
            q = q.where(sa.or_(own, fleets.c.id.in_(fleets_imported_by(project_ids))) if imported else own)
        if not include_deleted:
            q = q.where(fleets.c.deleted == sa.false())
        if statuses is not None:
            q = q.where(fleets.c.status.in_(statuses))
        if after is not None:
            cmp = sa.tuple_(fleets.c.created_at, fleets.c.id)
            bound = sa.tuple_(*(sa.literal(v) for v in after))
            q = q.where(cmp > bound if ascending else cmp < bound)
        order = (fleets.c.created_at, fleets.c.id)
        q = q.order_by(*(c.asc() if ascending else c.desc() for c in order))
        if limit is not None:
            q = q.limit(limit)
        rows = _plain(await conn.execute(q))
    pn = {r.project_id: r.project_name for r in rows}
    insts = await _instances_of(conn, rows, pn, only_active=True)
    return [_fleet(r, r.project_name, insts[r.id]) for r in rows]


async def get_fleet(
    conn: AsyncConnection, project_id: str, name: str | None = None, fleet_id: str | None = None
) -> FleetRec | None:
    q = sa.select(fleets, projects.c.name.label("project_name")).join(projects, projects.c.id == fleets.c.project_id)
    q = q.where(fleets.c.project_id == project_id)
    if fleet_id is not None:
        q = q.where(fleets.c.id == fleet_id)
    else:
        q = q.where(fleets.c.name == name, fleets.c.deleted == sa.false())
    row = (await conn.execute(q)).first()
    if row is None:
        return None
    insts = await _instances_of(conn, [row], {row.project_id: row.project_name}, only_active=False)
    return _fleet(row, row.project_name, insts[row.id])


async def insert_fleet(conn: AsyncConnection, values: dict[str, Any]) -> None:
    """A new fleet; :class:`~corral.store.errors.Conflict` if the project has a live one of that name."""
    try:
        await conn.execute(sa.insert(fleets).values(deleted=False, **values))
    except sa.exc.IntegrityError as e:
        raise Conflict(str(e.orig)) from e


async def update_fleet(
    conn: AsyncConnection, fleet_id: str, values: dict[str, Any], actor_id: str | None = None
) -> None:
    """Change a fleet; a status change is recorded as an event (by ``actor_id``, None: the system)."""
    await tracked_update(conn, fleets, fleets.c.id == fleet_id, values, actor_id)


async def fleet_live_job_count(conn: AsyncConnection, fleet_id: str) -> int:
    q = (
        sa.select(sa.func.count())
        .select_from(jobs.join(instances, instances.c.id == jobs.c.instance_id))
        .where(instances.c.fleet_id == fleet_id, jobs.c.status.in_(LIVE_JOB_STATUSES))
    )
    return int((await conn.execute(q)).scalar_one())


async def list_instances(
    conn: AsyncConnection,
    project_ids: Sequence[str] | None = None,
    fleet_ids: Sequence[str] | None = None,
    statuses: Sequence[str] | None = None,
    backends: Sequence[str] | None = None,
) -> list[InstanceRec]:
    q = (
        sa.select(instances, projects.c.name.label("project_name"), fleets.c.name.label("fleet_name"))
        .join(projects, projects.c.id == instances.c.project_id)
        .outerjoin(fleets, fleets.c.id == instances.c.fleet_id)
        .where(instances.c.deleted == sa.false())
    )
    if project_ids is not None:
        q = q.where(instances.c.project_id.in_(project_ids))
    if fleet_ids is not None:
        q = q.where(instances.c.fleet_id.in_(fleet_ids))
    if statuses is not None:
        q = q.where(instances.c.status.in_(statuses))
    if backends is not None:
        q = q.where(instances.c.backend.in_(backends))
    q = q.order_by(instances.c.created_at.desc(), instances.c.id)
    return [instance_from_row(r, r.project_name, r.fleet_name) for r in await conn.execute(q)]


#: Every idle instance's idle clock (found through ``ix_instances_status``), a few columns each, no document decoded
_IDLE_CLOCKS = sa.select(
    instances.c.id,
    instances.c.project_id,
    instances.c.fleet_id,
    instances.c.backend,
    instances.c.idle_duration,
    instances.c.last_job_finished_at,
    sa.func.coalesce(instances.c.last_job_finished_at, instances.c.started_at, instances.c.created_at),
).where(instances.c.deleted == sa.false(), instances.c.status == "idle")


async def idle_clocks(conn: AsyncConnection) -> list[IdleClock]:
    """Every idle instance, as much of it as tells how long it has been idle (read on every pass of the
    instances worker: with thousands of hosts, whole rows with their offers and agents cost tens of ms)."""
    return [IdleClock(*r) for r in await conn.execute(_IDLE_CLOCKS)]


#: ``instances/list``'s page: every instance, deleted (terminated) ones included, as dstack 0.22.5 lists them
#: (``list_projects_instance_models`` in ``server/services/instances.py`` leaves the deleted ones out only with
#: ``only_active``), newest first as dstack orders them (``created_at`` descending, then ``id`` ascending;
#: ``ascending`` reverses both), read from ``ix_instances_created``.
_INSTANCE_PAGE = (
    sa.select(instances, projects.c.name.label("project_name"), fleets.c.name.label("fleet_name"))
    .join(projects, projects.c.id == instances.c.project_id)
    .outerjoin(fleets, fleets.c.id == instances.c.fleet_id)
)


#: How near a stored time must be to a keyset's wire time to be "the same time". The wire rounds to the
#: microsecond, so a row's own time is up to 0.5 µs off, plus the float's own rounding: at today's epoch a double
#: steps by 0.24 µs, so a half-microsecond window could leave a row's own time just outside it, and the row would
#: come back on the page after itself. A whole microsecond holds it with room; rows of different wire times
#: within it are ordered by id, as rows of the same time are.
_SAME_INSTANT = 1e-6


def instance_page_query(query: InstanceQuery) -> sa.Select[Any]:
    """The statement of :func:`instance_page` (the tests read its plan)."""
    q = _INSTANCE_PAGE
    if query.project_ids is not None:
        own: sa.ColumnElement[bool] = instances.c.project_id.in_(query.project_ids)
        if query.include_imported and query.project_ids:  # dstack's: the instances of fleets exported to them too
            own = sa.or_(own, instances.c.fleet_id.in_(fleets_imported_by(query.project_ids)))
        q = q.where(own)
    if query.fleet_ids is not None:
        q = q.where(instances.c.fleet_id.in_(query.fleet_ids))
    if query.only_active:  # dstack's: not deleted, idle or busy (read by status, not the history's rows)
        q = q.where(instances.c.deleted == sa.false(), instances.c.status.in_(READY_INSTANCE))
    created, iid = instances.c.created_at, instances.c.id
    if query.after is not None:
        # dstack's keyset; "the same time" is within :data:`_SAME_INSTANT` (the wire's resolution is the
        # microsecond; a stored time is finer); the first term bounds the index's range
        at, prev_id = query.after
        lo, hi = at - _SAME_INSTANT, at + _SAME_INSTANT
        if query.ascending:
            q = q.where(created >= lo, created >= hi if prev_id is None else sa.or_(created >= hi, iid < prev_id))
        else:
            q = q.where(created < hi, created < lo if prev_id is None else sa.or_(created < lo, iid > prev_id))
    order = (created.asc(), iid.desc()) if query.ascending else (created.desc(), iid.asc())
    return q.order_by(*order).limit(query.limit)


async def instance_page(conn: AsyncConnection, query: InstanceQuery) -> list[InstanceRec]:
    """A page of ``instances/list`` (:class:`InstanceQuery` says which), the deleted (terminated) instances of
    the history included unless ``only_active``, as dstack lists them."""
    return [
        instance_from_row(r, r.project_name, r.fleet_name)
        for r in _plain(await conn.execute(instance_page_query(query)))
    ]


async def insert_instance(conn: AsyncConnection, values: dict[str, Any], actor_id: str | None = None) -> None:
    """Insert an instance that is no capacity reservation: an SSH fleet's host (reservations: ``plan_apply``)."""
    defaults = {"unreachable": False, "busy_blocks": 0, "deleted": False}
    await conn.execute(sa.insert(instances).values(**{**defaults, **values}))
    await emit(
        conn,
        f"Instance created on fleet submission. Status: {str(values['status']).upper()}",
        actor_id,
        [instance_target(values["project_id"], values["id"], values["name"], values.get("fleet_id"))],
    )


async def get_instance(conn: AsyncConnection, instance_id: str) -> InstanceRec | None:
    rows = await list_instances_by_ids(conn, [instance_id])
    return rows[0] if rows else None


#: The instances ``:ids`` with their project's and fleet's names (built once: ``store/prebuilt.py`` says why).
_INSTANCES_NAMED = (
    sa.select(instances, projects.c.name.label("project_name"), fleets.c.name.label("fleet_name"))
    .join(projects, projects.c.id == instances.c.project_id)
    .outerjoin(fleets, fleets.c.id == instances.c.fleet_id)
)
_INSTANCES_BY_IDS = _INSTANCES_NAMED.where(instances.c.id.in_(sa.bindparam("ids", expanding=True)))


async def list_instances_by_ids(conn: AsyncConnection, ids: Sequence[str]) -> list[InstanceRec]:
    if not ids:
        return []
    if len(ids) <= prebuilt.LISTED:  # a pass over the jobs a placement just handed over: a few
        rows = await direct.execute(conn, _instances_by_ids(len(ids)), prebuilt.ids_params(ids))
    else:
        rows = await conn.execute(_INSTANCES_BY_IDS, {"ids": list(ids)})
    return [instance_from_row(r, r.project_name, r.fleet_name) for r in rows]


#: :data:`_INSTANCES_BY_IDS` for a few ids, one parameter each (``prebuilt.in_ids``), by their number.
_INSTANCES_LISTED: dict[int, sa.Select[Any]] = {}


def _instances_by_ids(n: int) -> sa.Select[Any]:
    stmt = _INSTANCES_LISTED.get(n)
    if stmt is None:
        stmt = _INSTANCES_LISTED[n] = _INSTANCES_NAMED.where(prebuilt.in_ids(instances.c.id, n))
    return stmt


async def instance_statuses(conn: AsyncConnection, ids: Sequence[str]) -> dict[str, str]:
    """The status of each instance of ``ids`` that has a row (terminated and deleted ones included)."""
    out: dict[str, str] = {}
    for start in range(0, len(ids), 500):  # bounded lists of bound parameters
        q = sa.select(instances.c.id, instances.c.status).where(instances.c.id.in_(list(ids[start : start + 500])))
        out.update({r.id: r.status for r in await conn.execute(q)})
    return out


async def update_instance(
    conn: AsyncConnection,
    instance_id: str,
    values: dict[str, Any],
    expect_status: Sequence[str] | None = None,
    actor_id: str | None = None,
) -> bool:
    """Change an instance; a status or reachability change is recorded as an event."""
    return await tracked_update_by_id(conn, instances, instance_id, values, expect_status, actor_id)


#: The blocks unfinished jobs hold on an instance (``:_id``), recounted from the job rows.
_LIVE_BLOCKS = sa.select(sa.func.coalesce(sa.func.sum(jobs.c.blocks), 0)).where(
    jobs.c.instance_id == sa.bindparam("_id"),
    jobs.c.status.in_(
        [sa.literal(s, jobs.c.status.type) for s in LIVE_JOB_STATUSES]
    ),  # sent as compiled (``store/direct.py``)
)


async def live_blocks_on(conn: AsyncConnection, instance_id: str) -> int:
    """Blocks held by unfinished jobs on an instance, recounted from the job rows. A writer that stores the count
    locks the instance's row first (:func:`lock_instance`), so that no job's end commits between its count and
    its write."""
    return int((await direct.execute(conn, _LIVE_BLOCKS, {"_id": instance_id})).scalar_one())


_LOCK_INSTANCE = sa.select(instances.c.id).where(instances.c.id == sa.bindparam("_id")).with_for_update()


async def lock_instance(conn: AsyncConnection, instance_id: str) -> None:
    """Lock an instance's row for the rest of the transaction (``SELECT ... FOR UPDATE`` on Postgres; SQLite's
    write transaction already excludes every other writer). Taken before a count of its blocks is written: a
    count read first and written after another transaction's job end committed would leave the instance ``busy``
    with no job on it, for good."""
    if conn.dialect.name != "sqlite":  # there it would be a read for nothing, one per placement and job's end
        await conn.execute(_LOCK_INSTANCE, {"_id": instance_id})


async def release_instance(conn: AsyncConnection, instance_id: str, now: float) -> None:
    """Recount an instance's busy blocks after a job let go of it; idle when none are left."""
    await lock_instance(conn, instance_id)  # two jobs ending at once on it: the second counts after the first
    busy = await live_blocks_on(conn, instance_id)
    values: dict[str, Any] = {"busy_blocks": busy, "last_processed_at": now}
    if busy == 0:
        values["last_job_finished_at"] = now
        # a busy instance goes idle in the same write (one that is not busy keeps its status)
        if await tracked_update_by_id(conn, instances, instance_id, {**values, "status": "idle"}, ("busy",)):
            return
    await tracked_update_by_id(conn, instances, instance_id, values)


def dump(value: Any) -> str:
    return orjson.dumps(value, default=json_default).decode()
