"""Gangs waiting to be launched: the pending instances that jobs of one multi-node run were committed to
(``plan_apply`` reserves a gang whole or not at all), in a fleet with ``placement: cluster``, with what
their launch needs -- the run's or the fleet's ``reservation``. A lone instance that launches into a
capacity reservation is a gang of one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.retry import retry_duration
from corral.store.tables import fleets, instances, jobs


@dataclass(frozen=True)
class PendingGang:
    """Instances launched together: a multi-node run's in a ``placement: cluster`` fleet (``cluster``), or
    one instance that launches into a capacity reservation."""

    #: The run (or, for a lone instance with no job, the instance) the gang is of.
    key: str
    #: The pending instances, lead first (instance number order).
    instance_ids: tuple[str, ...]
    #: The capacity reservation the run (else the fleet) names, or None.
    reservation: str | None
    cluster: bool
    #: How long the gang may wait for EC2 capacity (its run's ``retry`` covers ``no-capacity``), or None.
    wait: float | None = None


async def pending_gangs(conn: AsyncConnection, instance_ids: Sequence[str]) -> list[PendingGang]:
    """The gangs among the pending instances ``instance_ids``: the instances of a multi-node run in a
    cluster fleet, or one whose run or fleet names a capacity reservation."""
    if not instance_ids:
        return []
    q = (
        sa.select(instances.c.id, instances.c.instance_num, jobs.c.run_id, jobs.c.job_spec, fleets.c.spec)
        .select_from(instances.outerjoin(jobs, jobs.c.instance_id == instances.c.id))
        .join(fleets, fleets.c.id == instances.c.fleet_id)
        .where(instances.c.id.in_(list(instance_ids)), instances.c.status == "pending")
    )
    members: dict[str, list[tuple[int, str]]] = {}
    about: dict[str, tuple[str | None, bool, float | None]] = {}
    for r in await conn.execute(q):
        conf = orjson.loads(r.spec).get("configuration") or {}
        req = (orjson.loads(r.job_spec).get("requirements") or {}) if r.job_spec else {}
        # the run's own, else the fleet's (a run whose differs gets no new instance in the fleet: ``fleet_view``)
        reservation = req.get("reservation") or conf.get("reservation") or None
        cluster = conf.get("placement") == "cluster" and bool(req.get("multinode"))
        if not cluster and not reservation:
            continue
        retry = (orjson.loads(r.job_spec).get("retry") if r.job_spec else None) or {}
        wait = retry_duration(retry) if "no-capacity" in (retry.get("on_events") or ()) else None
        key = r.run_id if cluster else r.id
        members.setdefault(key, []).append((r.instance_num, r.id))
        about[key] = (reservation, cluster, wait)
    return [PendingGang(key, tuple(i for _, i in sorted(m)), *about[key]) for key, m in members.items()]


async def note_waiting(
    conn: AsyncConnection, instance_ids: Sequence[str], message: str, on_instances: bool = False
) -> None:
    """Say on the jobs of a gang that waits for capacity why they wait (their instances stay reserved); with
    ``on_instances``, on the pending instances too (a Slurm allocation's pending reason)."""
    await conn.execute(
        sa.update(jobs)
        .where(jobs.c.instance_id.in_(list(instance_ids)), jobs.c.status == "provisioning")
        .values(status_message=message)
    )
    if on_instances:
        await conn.execute(
            sa.update(instances)
            .where(instances.c.id.in_(list(instance_ids)), instances.c.status == "pending")
            .values(status_message=message)
        )


async def placed_max_duration(conn: AsyncConnection, instance_ids: Sequence[str]) -> float | None:
    """The shortest ``max_duration`` (seconds) of the jobs reserved on these instances; None: none has one."""
    q = sa.select(jobs.c.job_spec).where(jobs.c.instance_id.in_(list(instance_ids)), jobs.c.status == "provisioning")
    limits = [
        float(v)
        for (spec,) in await conn.execute(q)
        if spec and isinstance(v := orjson.loads(spec).get("max_duration"), (int, float)) and v > 0
    ]
    return min(limits) if limits else None
