"""Requests to each service counted in memory and written once a second (``services.service_stats``): one
row per service and second for this server replica, however many requests it proxied -- never a write per
request. The autoscaler sums every server replica's rows, so N replicas behind a load balancer scale on
the total. A service waiting at zero replicas has its count written at once (``flush_now``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from corral.context import Context
from corral.proxy.asgi import Send
from corral.services import service_stats

log = logging.getLogger("corral.proxy")

#: The answer's header that tells a gateway the request it forwarded was counted here (held at zero
#: replicas, it is counted at once to wake the service), so that the gateway does not count it again.
COUNTED_HEADER = b"x-corral-counted"


def telling_counted(send: Send) -> Send:
    """``send`` with :data:`COUNTED_HEADER` added to the answer's head."""

    async def wrapped(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (COUNTED_HEADER, b"1")]}
        await send(message)

    return wrapped


class RequestCounter:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._counts: dict[tuple[str, int], int] = {}
        self._task: asyncio.Task[None] | None = None
        #: Writes done (the benchmark and the tests count them).
        self.writes = 0

    def count(self, run_id: str) -> None:
        key = (run_id, int(time.time()))
        self._counts[key] = self._counts.get(key, 0) + 1
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="corral-proxy-stats")

    async def _loop(self) -> None:
        while self._counts:
            await asyncio.sleep(1.0 - time.time() % 1.0 + 0.01)
            with contextlib.suppress(Exception):
                await self._flush(int(time.time()))

    async def _flush(self, before: int, run_id: str | None = None, wake: bool = False) -> None:
        """Write the seconds before ``before`` (of ``run_id`` only, with every second so far, when given)."""
        due = [k for k in self._counts if (k[0] == run_id if run_id is not None else k[1] < before)]
        rows = [(k[0], k[1], self._counts.pop(k)) for k in due]
        if not rows and not wake:
            return
        try:
            await service_stats.record(self.ctx, rows, wake=wake)
            self.writes += 1
        except Exception:
            log.warning("could not write the request counts of %d service-second(s)", len(rows), exc_info=True)
            for r, s, n in rows:  # kept for the next flush
                self._counts[(r, s)] = self._counts.get((r, s), 0) + n
            raise

    async def flush_now(self, run_id: str) -> None:
        """A request waits for a service at zero replicas: its count is written now and the scaler woken."""
        await self._flush(0, run_id=run_id, wake=True)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
