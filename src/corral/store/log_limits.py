"""The per-job limit on stored output (``CORRAL_JOB_LOG_LIMIT_MB``): how many bytes of a job's output are
stored, and dropping its oldest entries down to a size, keeping the newest.

Imports ``domain`` and sqlalchemy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.records import AGENT_LOG_SOURCE
from corral.store.tables import logs


@dataclass(frozen=True)
class Trimmed:
    """What :func:`trim` dropped of a job's output and what it kept."""

    entries: int
    size: int
    kept: int


async def stored_bytes(conn: AsyncConnection, job_id: str) -> int:
    """The bytes of output (and agent lines) stored for the job."""
    q = sa.select(sa.func.coalesce(sa.func.sum(sa.func.length(logs.c.message)), 0)).where(logs.c.job_id == job_id)
    return int((await conn.execute(q)).scalar_one())


async def trim(conn: AsyncConnection, job_id: str, keep: int) -> Trimmed:
    """Drop the job's oldest output entries so that at most ``keep`` bytes of it are left (the agent's own lines
    about the job are kept)."""
    output = sa.and_(logs.c.job_id == job_id, logs.c.source != AGENT_LOG_SOURCE)
    newest_first = (
        sa.select(
            logs.c.id,
            sa.func.sum(sa.func.length(logs.c.message)).over(order_by=logs.c.id.desc()).label("upto"),
        )
        .where(output)
        .subquery()
    )
    cut = (await conn.execute(sa.select(sa.func.max(newest_first.c.id)).where(newest_first.c.upto > keep))).scalar()
    if cut is None:
        return Trimmed(0, 0, await stored_bytes(conn, job_id))
    dropped = sa.and_(output, logs.c.id <= cut)
    count, size = (
        await conn.execute(
            sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(sa.func.length(logs.c.message)), 0)).where(dropped)
        )
    ).one()
    await conn.execute(sa.delete(logs).where(dropped))
    return Trimmed(int(count), int(size), await stored_bytes(conn, job_id))
