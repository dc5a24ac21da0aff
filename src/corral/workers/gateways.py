"""The gateways worker: what happens to a gateway after the API wrote it -- deployed on its host, kept serving
its services, removed with its host given back (``workers.gateway_ops``, which says how).

Load -> decide (pure, ``domain.gateway_ops``) -> act -> apply, in short transactions; imports ``domain``,
``store``, ``backends``, ``context``. The operator (and with it httpx, the SSH client and the gateway's zipapp
builder) is imported only once a gateway exists: a server without gateways starts without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral.context import Context
from corral.store import gateway_ops as ops_store

if TYPE_CHECKING:
    from corral.workers.gateway_ops import GatewayOperator


class Gateways:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.operator: GatewayOperator | None = None

    async def pass_once(self) -> None:
        if self.operator is None:
            async with self.ctx.db.read() as conn:
                if not await ops_store.live(conn):
                    return
            from corral.workers.gateway_ops import GatewayOperator

            self.operator = GatewayOperator(self.ctx)
        await self.operator.pass_once()

    async def close(self) -> None:
        """Close the SSH connections and forwards to the gateways' hosts (the gateways keep running)."""
        if self.operator is not None:
            await self.operator.close()
