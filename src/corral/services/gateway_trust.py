"""Which secrets are gateways': a request the in-server proxy receives with ``X-Corral-Gateway: <secret>``
comes from a gateway of this server when the secret's sha256 is a gateway's stored hash (the secret itself is
never stored in clear where the proxy reads it). The proxy caches the hashes (``proxy.gateway_trust``)."""

from __future__ import annotations

import hashlib

from corral.context import Context
from corral.store import gateway_ops

#: The header a gateway adds to every request it forwards to the server.
HEADER = b"x-corral-gateway"


def secret_hash(secret: str) -> str:
    """sha256 of a gateway's secret, hex (as the gateways table stores it)."""
    return hashlib.sha256(secret.encode()).hexdigest()


async def secret_hashes(ctx: Context) -> frozenset[str]:
    async with ctx.db.read() as conn:
        return await gateway_ops.secret_hashes(conn)
