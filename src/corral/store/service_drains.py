"""Which server replicas may have requests in flight to which service replica (``service_drains``).

A server's proxy ``hold``s a replica before its first request to it: the row is written only while the
replica is in rotation (``drain_at`` unset, no stop asked), in the same statement that checks it, so a
server that still routes from a stale cache cannot start on a replica the scaling worker may be about
to stop. The proxy ``release``s the row once the replica left its route and nothing is in flight. The
scaling worker stops a drained replica that no row holds (``holders``), and drops the rows of the
replicas it stops (``forget``: those of a server that died holding them).

Imports the store's tables only.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.statuses import FINISHED_JOB
from corral.store.tables import jobs, service_drains


async def hold(conn: AsyncConnection, job_id: str, server: str, now: float) -> bool:
    """Record that ``server`` sends requests to ``job_id``; False (nothing written) when the replica left
    rotation meanwhile."""
    held = (
        await conn.execute(
            sa.select(service_drains.c.job_id).where(
                service_drains.c.job_id == job_id, service_drains.c.server == server
            )
        )
    ).first()
    in_rotation = sa.select(sa.literal(job_id), sa.literal(server), sa.literal(now)).where(
        sa.exists().where(jobs.c.id == job_id, jobs.c.drain_at.is_(None), jobs.c.stop_requested.is_(None))
    )
    if held is not None:
        return (await conn.execute(sa.select(sa.exists(in_rotation)))).scalar() is True
    result = await conn.execute(sa.insert(service_drains).from_select(["job_id", "server", "since"], in_rotation))
    return bool(result.rowcount)


async def release(conn: AsyncConnection, job_ids: Sequence[str], server: str) -> None:
    if job_ids:
        await conn.execute(
            sa.delete(service_drains).where(
                service_drains.c.job_id.in_(list(job_ids)), service_drains.c.server == server
            )
        )


async def holders(conn: AsyncConnection, job_ids: Sequence[str]) -> dict[str, int]:
    """How many server replicas hold each of ``job_ids`` (absent: none)."""
    if not job_ids:
        return {}
    rows = await conn.execute(
        sa.select(service_drains.c.job_id, sa.func.count())
        .where(service_drains.c.job_id.in_(list(job_ids)))
        .group_by(service_drains.c.job_id)
    )
    return {r[0]: int(r[1]) for r in rows}


async def forget(conn: AsyncConnection, job_ids: Sequence[str]) -> None:
    if job_ids:
        await conn.execute(sa.delete(service_drains).where(service_drains.c.job_id.in_(list(job_ids))))


#: The rows of replicas that ended, read from the few rows held, each job looked up by its id (a join lets SQLite
#: walk every finished job ever, by status, and look each one up here: 1.6 s with a million).
ENDED_DRAINS = sa.select(service_drains.c.job_id).where(
    sa.exists().where(jobs.c.id == service_drains.c.job_id, jobs.c.status.in_(FINISHED_JOB))
)


async def prune(conn: AsyncConnection) -> None:
    """Drop the rows of replicas that ended (a server replica that died holding them never released them)."""
    await forget(conn, sorted({r[0] for r in await conn.execute(ENDED_DRAINS)}))
