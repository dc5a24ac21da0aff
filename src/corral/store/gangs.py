"""Gangs waiting to be launched: the pending instances that jobs of one multi-node run were committed to
(``plan_apply`` reserves a gang whole or not at all), in a fleet with ``placement: cluster``, with what
their launch needs -- the fleet's or the run's ``reservation``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store.tables import fleets, instances, jobs


@dataclass(frozen=True)
class PendingGang:
    run_id: str
    #: The pending instances, lead first (instance number order).
    instance_ids: tuple[str, ...]
    #: The capacity reservation the run's jobs or the fleet name (the run's wins), or None.
    reservation: str | None


async def pending_gangs(conn: AsyncConnection, instance_ids: Sequence[str]) -> list[PendingGang]:
    """The gangs (two instances or more) among the pending instances ``instance_ids``."""
    if not instance_ids:
        return []
    q = (
        sa.select(instances.c.id, instances.c.instance_num, jobs.c.run_id, jobs.c.job_spec, fleets.c.spec)
        .select_from(instances.join(jobs, jobs.c.instance_id == instances.c.id))
        .join(fleets, fleets.c.id == instances.c.fleet_id)
        .where(instances.c.id.in_(list(instance_ids)), instances.c.status == "pending")
    )
    by_run: dict[str, list[tuple[int, str]]] = {}
    reservation: dict[str, str | None] = {}
    for r in await conn.execute(q):
        conf = orjson.loads(r.spec).get("configuration") or {}
        if conf.get("placement") != "cluster":
            continue
        req = orjson.loads(r.job_spec).get("requirements") or {}
        if not req.get("multinode"):
            continue
        by_run.setdefault(r.run_id, []).append((r.instance_num, r.id))
        reservation[r.run_id] = req.get("reservation") or conf.get("reservation") or None
    return [
        PendingGang(run, tuple(i for _, i in sorted(members)), reservation[run])
        for run, members in by_run.items()
        if len(members) > 1
    ]
