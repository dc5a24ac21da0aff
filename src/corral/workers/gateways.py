"""The gateways worker: what happens to a gateway after the API wrote it.

Today one step: :func:`remove_deleted` releases the host of each gateway marked for deletion and removes its
row (nothing is deployed on a host yet, so nothing is torn down). The deployment and operation of the
gateway's process extend this module: they tear a gateway down before :func:`remove_deleted` removes it.
Load -> act -> apply, in short transactions; imports ``domain`` and ``store``.
"""

from __future__ import annotations

import logging
import time

from corral.context import Context
from corral.domain.gateways import GatewayRec
from corral.store import gateways as store
from corral.store import plan_apply

log = logging.getLogger("corral.gateways")


class Gateways:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    async def pass_once(self) -> None:
        async with self.ctx.db.read() as conn:
            todo = await store.to_operate(conn)
        deleted = [g for g in todo if g.to_be_deleted]
        if deleted and await remove_deleted(self.ctx, deleted):
            self.ctx.wakeups.wake("scheduler")


async def remove_deleted(ctx: Context, marked: list[GatewayRec]) -> int:
    """Release the host of each gateway of ``marked`` still marked for deletion, and remove the gateway (one
    transaction each); how many were removed. Its host is idle again and offered to jobs."""
    removed = 0
    for g in marked:
        async with ctx.db.write() as conn:
            now = await store.get(conn, g.id)
            if now is None or not now.to_be_deleted:
                continue
            if now.instance_id is not None:
                await plan_apply.release_gateway_hold(conn, now.instance_id, now.id, time.time())
            await store.delete(conn, now)
        removed += 1
        log.info("gateway %s of project %s deleted", g.name, g.project_name, extra={"event": "gateway_deleted"})
    return removed
