"""The proxy's trust in gateways: a request whose ``X-Corral-Gateway`` header carries a gateway's secret comes
from that gateway, which has done the caller's auth (so the proxy does not check the token again) and counts
the request in its own stats (so the proxy does not). Anything else -- no header, a wrong secret -- is an
ordinary request.

The hashes are cached (``CACHE_TTL``): a steady stream of requests makes no database query. A secret not
found reads them again at most once a second (a gateway created since), so wrong secrets cannot make a query
each. The comparison runs over every hash in constant time.
"""

from __future__ import annotations

import hmac
import time

from corral.context import Context
from corral.services import gateway_trust

#: Seconds the gateways' hashes are kept.
CACHE_TTL = 10.0
#: Seconds between two reads caused by a secret not found.
MISS_PAUSE = 1.0


class GatewayTrust:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._hashes: frozenset[str] = frozenset()
        self._read_at: float | None = None
        #: Reads of the hashes (the tests count them).
        self.reads = 0

    async def _load(self) -> None:
        self._hashes = await gateway_trust.secret_hashes(self.ctx)
        self._read_at = time.monotonic()
        self.reads += 1

    def _match(self, digest: str) -> bool:
        found = False
        for h in self._hashes:
            found |= hmac.compare_digest(h, digest)
        return found

    async def trusted(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """Whether the request's ``X-Corral-Gateway`` names a gateway of this server."""
        secret = next((v for k, v in headers if k == gateway_trust.HEADER), None)
        if not secret:
            return False
        digest = gateway_trust.secret_hash(secret.decode("latin-1"))
        now = time.monotonic()
        if self._read_at is None or now - self._read_at > CACHE_TTL:
            await self._load()
        if self._match(digest):
            return True
        if self._read_at is not None and time.monotonic() - self._read_at >= MISS_PAUSE:
            await self._load()
            return self._match(digest)
        return False
