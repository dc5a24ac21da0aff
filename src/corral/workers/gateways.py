"""The gateways worker: what happens to a gateway after the API wrote it -- deployed on its host, kept serving
its services, removed with its host given back (``workers.gateway_ops``, which says how).

Load -> decide (pure, ``domain.gateway_ops``) -> act -> apply, in short transactions; imports ``domain``,
``store``, ``backends``, ``context``.
"""

from __future__ import annotations

from corral.context import Context
from corral.workers.gateway_ops import GatewayOperator


class Gateways:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.operator = GatewayOperator(ctx)

    async def pass_once(self) -> None:
        await self.operator.pass_once()

    async def close(self) -> None:
        """Close the SSH connections and forwards to the gateways' hosts (the gateways keep running)."""
        await self.operator.close()
