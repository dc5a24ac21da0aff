"""The requests the in-server proxy counted, written for the autoscaler: one row per service and second
this server replica counted (``store.service_scaling.record_requests``), and the wake-up that makes the
scaling worker look at once (a service at zero replicas got a request)."""

from __future__ import annotations

from collections.abc import Sequence

from corral.context import Context
from corral.store import service_scaling as store


async def record(ctx: Context, counts: Sequence[tuple[str, int, int]], wake: bool = False) -> None:
    """Write ``(run_id, second, requests)`` rows as this server replica's; ``wake``: scale now."""
    if counts:
        async with ctx.db.write() as conn:
            await store.record_requests(conn, ctx.replica_id, counts)
    if wake:
        ctx.wakeups.wake("services")
