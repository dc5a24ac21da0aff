"""The fleets as the scheduling worker reads them, pass after pass: only the instances that changed are read whole.

Every write of an instance's row moves its ``version`` (the column's ``onupdate``, which every UPDATE SQLAlchemy
builds of the table carries). A pass reads the live instances' ``(id, fleet, version)`` from their own partial
index (``ix_instances_live``: no table rows), by the driver itself, and compares it with the state it read before
as sets, in C: only the instances that came or moved are read whole and parsed, the others are the records the
last read made, the same objects (so that what is built from them can be kept by identity:
``workers/snapshot_builder.py``). Each fleet's row is read every pass (a few hundred at most) and its spec parsed
again only when its text changed.

What is read may be stale by the time the plan is committed, as any read of the pass: the commit point locks and
recounts from the rows (``plan_apply``). A row written between the state's read and its whole read is read as it
is then, with the version it then has: the next pass compares against that.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.records import FleetRec, InstanceRec
from corral.domain.statuses import FLEET_STATUS
from corral.store import direct, prebuilt
from corral.store.fleets import instance_from_row
from corral.store.tables import LIVE_INSTANCE_SQL, fleets, instances, projects

#: An instance's state as a pass reads it: (id, fleet id, version).
State = tuple[str, "str | None", int]

#: SQLite's planner is told which index to read (as the queue's state is: ``queue_reader``).
STATE_SQL = {
    "sqlite": f"SELECT id, fleet_id, version FROM instances INDEXED BY ix_instances_live WHERE {LIVE_INSTANCE_SQL}",
    "postgresql": f"SELECT id, fleet_id, version FROM instances WHERE {LIVE_INSTANCE_SQL}",
}
#: Every fleet not deleted, newest first, with its project's name.
_FLEETS = (
    sa.select(fleets, projects.c.name.label("project_name"))
    .join(projects, projects.c.id == fleets.c.project_id)
    .where(fleets.c.deleted == sa.false())
    .order_by(fleets.c.created_at.desc(), fleets.c.id.desc())
)
_WHOLE = sa.select(instances).where(instances.c.id.in_(sa.bindparam("ids", expanding=True)))
#: How many ids one whole read binds at most.
_CHUNK = 500
#: :data:`_WHOLE` for a few ids (a pass after a placement or a job's end: one), one parameter each, by their number.
_WHOLE_LISTED: dict[int, sa.Select[Any]] = {}


async def _whole(conn: AsyncConnection, ids: list[str]) -> Any:
    """The instances ``ids`` read whole: a few by a statement sent as compiled (``store/direct.py``)."""
    if len(ids) > prebuilt.LISTED:
        return await conn.execute(_WHOLE, {"ids": ids})
    stmt = _WHOLE_LISTED.get(len(ids))
    if stmt is None:
        stmt = _WHOLE_LISTED[len(ids)] = sa.select(instances).where(prebuilt.in_ids(instances.c.id, len(ids)))
    return await direct.execute(conn, stmt, prebuilt.ids_params(ids))


async def _instance_state(conn: AsyncConnection) -> set[State]:
    """The live instances' state, read by the driver in the caller's transaction (SQLAlchemy's result rows cost
    more than the query for thousands of instances, and this read is made on every pass)."""
    driver: Any = (await conn.get_raw_connection()).driver_connection
    if conn.dialect.name == "sqlite":  # aiosqlite's connection (made in place: ``sqlite_inline``)
        return set(await driver.execute_fetchall(STATE_SQL["sqlite"]))
    return set(map(tuple, await driver.fetch(STATE_SQL["postgresql"])))  # asyncpg's


@dataclass
class FleetReader:
    """The fleets and live instances as last read."""

    #: The state as last read, with each instance's version as it was read whole.
    _state: set[State] = field(default_factory=set)
    #: fleet id -> its live instances as last read whole, by id.
    _members: dict[str, dict[str, InstanceRec]] = field(default_factory=dict)
    #: fleet id -> its row as last read, and the record made of it.
    _fleets: dict[str, tuple[Any, FleetRec]] = field(default_factory=dict)
    #: Every live instance's state as the last read took it, of any fleet or none (``HoldingsReader`` reads the
    #: projects' holdings from it in the same transaction).
    live: set[State] = field(default_factory=set)

    async def read(self, conn: AsyncConnection) -> list[FleetRec]:
        """Active fleets, newest first, each with its live instances (by ``instance_num``)."""
        rows = [r for r in (await direct.execute(conn, _FLEETS)).all() if r.status == "active"]
        names = {r.id: (r.project_name, r.name) for r in rows}
        self.live = await _instance_state(conn)
        state = {s for s in self.live if s[1] in names}
        moved, gone = state - self._state, self._state - state
        touched = {s[1] for s in moved} | {s[1] for s in gone}
        for instance_id, fleet_id, _ in gone:
            self._members.get(str(fleet_id), {}).pop(instance_id, None)
        self._state -= gone
        ids = [s[0] for s in moved]
        for start in range(0, len(ids), _CHUNK):
            for row in await _whole(conn, ids[start : start + _CHUNK]):
                if row.fleet_id not in names or row.deleted or row.status == "terminated":  # went since the state
                    continue
                project_name, fleet_name = names[row.fleet_id]
                self._members.setdefault(row.fleet_id, {})[row.id] = instance_from_row(row, project_name, fleet_name)
                # kept at the version it was read at (it may have moved since the state's read: the next pass sees it)
                self._state.add((row.id, row.fleet_id, row.version))
        self._members = {k: v for k, v in self._members.items() if k in names}
        self._fleets = {k: v for k, v in self._fleets.items() if k in names}
        return [self._fleet(r, r.id in touched) for r in rows]

    def _fleet(self, row: Any, touched: bool) -> FleetRec:
        """The fleet's record: the one made last time while its row and its instances are the same."""
        kept = self._fleets.get(row.id)
        if kept is not None and not touched and kept[0] == row:
            return kept[1]
        members = self._members.get(row.id, {})
        if kept is not None and (kept[0].project_name, kept[0].name) != (row.project_name, row.name):
            members.update({k: _renamed(i, row) for k, i in members.items()})
        spec = kept[1].spec if kept is not None and kept[0].spec == row.spec else orjson.loads(row.spec)
        rec = FleetRec(
            id=row.id,
            project_id=row.project_id,
            project_name=row.project_name,
            name=row.name,
            created_at=row.created_at,
            status=FLEET_STATUS[row.status],
            status_message=row.status_message,
            spec=spec,
            deleted=row.deleted,
            instances=tuple(sorted(members.values(), key=lambda i: (i.instance_num, i.id))),
        )
        self._fleets[row.id] = (row, rec)
        return rec


def _renamed(rec: InstanceRec, fleet_row: Any) -> InstanceRec:
    return replace(rec, project_name=fleet_row.project_name, fleet_name=fleet_row.name)
