"""Requests to a service at zero replicas (``replicas: 0..N``): the first one makes the service scale up
(its count is written at once and the scaler woken, ``proxy.stats``) and every one is held until a replica
is ready, then served -- at most ``proxy_cold_start_queue`` held per service, for at most
``proxy_cold_start_timeout`` seconds; beyond either a fast 503 with ``Retry-After``.

Held requests wake when a replica's readiness changes (the ``services`` wake-up, here or from another
server replica); should that be lost, each reads its route again every second. While requests are held
the service is counted one request a second more, so that the autoscaler does not scale the starting
replica away (its window could otherwise empty before a slow replica is ready)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from corral.proxy.cache import Cache
from corral.services.service_routing import Route

FULL = "full"
TIMED_OUT = "timed out"
#: Seconds a held request waits for a wake-up before it reads its route again.
POLL = 1.0


class ColdStart:
    def __init__(
        self,
        routes: Cache[tuple[str, str], Route | None],
        trigger: Callable[[str], Awaitable[None]],
        queue: int,
        timeout: float,
        keep: Callable[[str], None] = lambda _run_id: None,
    ) -> None:
        self.routes = routes
        self.trigger = trigger
        self.keep = keep
        self._kept: dict[str, float] = {}
        self.queue = queue
        self.timeout = timeout
        self.held: dict[str, int] = {}
        self._event = asyncio.Event()

    def changed(self) -> None:
        """Routes may have changed: every held request looks again."""
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait(self, key: tuple[str, str], route: Route) -> Route | str | None:
        """The route once it has a ready replica; ``FULL``/``TIMED_OUT``; None: the service is gone."""
        run_id = route.run_id
        if self.held.get(run_id, 0) >= self.queue:
            return FULL
        self.held[run_id] = self.held.get(run_id, 0) + 1
        try:
            with contextlib.suppress(Exception):  # a failed write: the next second's flush counts it
                await self.trigger(run_id)
            deadline = time.monotonic() + self.timeout
            while True:
                event = self._event
                current = await self.routes.get(key)
                if current is None:
                    return None
                if current.replicas:
                    return current
                left = deadline - time.monotonic()
                if left <= 0:
                    return TIMED_OUT
                try:
                    await asyncio.wait_for(event.wait(), min(left, POLL))
                except asyncio.TimeoutError:
                    self.routes.forget(key)
                now = time.monotonic()
                if now - self._kept.get(run_id, 0.0) >= POLL:  # one a second per service, not per request
                    self._kept[run_id] = now
                    self.keep(run_id)
        finally:
            left_held = self.held[run_id] - 1
            if left_held:
                self.held[run_id] = left_held
            else:
                del self.held[run_id]
                self._kept.pop(run_id, None)
