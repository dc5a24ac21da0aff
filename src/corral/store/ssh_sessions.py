"""What the SSH endpoint's watcher reads and writes for all of its open connections at once: the state
that decides whether each connection's job still admits it, and the jobs whose connections count as
activity (``ssh_seen_at``). One query and at most one update per tick, however many connections are open.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store.tables import jobs, runs


@dataclass(frozen=True)
class Reachability:
    status: str
    termination_reason: str | None
    finished_at: float | None


async def reachability(conn: AsyncConnection, job_ids: Sequence[str]) -> dict[str, Reachability]:
    """The jobs among ``job_ids`` that exist in a run not deleted, with what admission depends on."""
    if not job_ids:
        return {}
    rows = await conn.execute(
        sa.select(jobs.c.id, jobs.c.status, jobs.c.termination_reason, jobs.c.finished_at)
        .join(runs, runs.c.id == jobs.c.run_id)
        .where(jobs.c.id.in_(list(job_ids)), runs.c.deleted == sa.false())
    )
    return {r.id: Reachability(r.status, r.termination_reason, r.finished_at) for r in rows}


async def mark_seen(conn: AsyncConnection, job_ids: Sequence[str], now: float) -> None:
    """A connection that counts is open on each of these running jobs: their inactivity restarts at ``now``."""
    if job_ids:
        await conn.execute(
            sa.update(jobs).where(jobs.c.id.in_(list(job_ids)), jobs.c.status == "running").values(ssh_seen_at=now)
        )
