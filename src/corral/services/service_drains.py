"""The proxy's side of draining (``store.service_drains``): this server replica holds a service replica
before its first request to it, and releases it once the replica left its route with nothing in flight
(the scaling worker is woken then: a drained replica that nobody holds is stopped)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from corral.context import Context
from corral.store import service_drains as store


async def hold(ctx: Context, job_id: str) -> bool:
    async with ctx.db.write() as conn:
        return await store.hold(conn, job_id, ctx.replica_id, time.time())


async def release(ctx: Context, job_ids: Sequence[str]) -> None:
    async with ctx.db.write() as conn:
        await store.release(conn, job_ids, ctx.replica_id)
    ctx.wakeups.wake("services")
