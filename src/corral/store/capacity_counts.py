"""What a reservation recounts from rows before the commit point (``plan_apply``) writes it, in the commit
point's own write transaction: the instances of a fleet that count against its ``nodes.max``, those of a backend
that count against the backend's instance limit, the lowest instance number free in the fleet, and the
``idle_duration`` the run of the job it is made for sets.

Reads only: ``plan_apply`` remains the one writer of capacity.
"""

from __future__ import annotations

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.durations import run_idle_duration
from corral.store.tables import LIVE_INSTANCE_SQL, instances, jobs, runs


def _live(*where: sa.ColumnElement[bool]) -> sa.ColumnElement[bool]:
    """Instances not yet confirmed terminated (what ``nodes.max`` and the backend limits count)."""
    return sa.and_(*where, instances.c.status != "terminated", instances.c.deleted == sa.false())


async def fleet_instances(conn: AsyncConnection, fleet_id: str) -> int:
    """The fleet's instances not yet confirmed terminated."""
    q = sa.select(sa.func.count()).select_from(instances).where(_live(instances.c.fleet_id == fleet_id))
    return int((await conn.execute(q)).scalar_one())


def backend_instances_query(backend: str) -> sa.Select[tuple[int]]:
    """:func:`backend_instances`'s count, from ``ix_instances_live_backend`` (its predicate spelled as the index's:
    the backend's live instances, not every instance the history left terminated)."""
    where = (instances.c.backend == backend, sa.text(LIVE_INSTANCE_SQL))
    return sa.select(sa.func.count()).select_from(instances).where(*where)


async def backend_instances(conn: AsyncConnection, backend: str) -> int:
    """The backend's instances not yet confirmed terminated, in every fleet."""
    return int((await conn.execute(backend_instances_query(backend))).scalar_one())


async def next_instance_num(conn: AsyncConnection, fleet_id: str) -> int:
    """The lowest instance number that no live instance of the fleet has."""
    q = sa.select(instances.c.instance_num).where(_live(instances.c.fleet_id == fleet_id))
    used = {r.instance_num for r in await conn.execute(q)}
    n = 0
    while n in used:
        n += 1
    return n


async def run_idle(conn: AsyncConnection, job_id: str) -> int | None:
    """The ``idle_duration`` the job's run sets (None: none)."""
    q = sa.select(runs.c.run_spec).select_from(jobs.join(runs, jobs.c.run_id == runs.c.id)).where(jobs.c.id == job_id)
    text = (await conn.execute(q)).scalar_one_or_none()
    return run_idle_duration(orjson.loads(text)) if text else None
