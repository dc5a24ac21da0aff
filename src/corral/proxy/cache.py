"""What the proxy remembers so that a steady stream of requests makes no database query: each service's
route (its ready replicas, ``auth``, ``strip_prefix``) and which tokens may use which project.

Both are dropped on every replica at once when they may have changed: the ``services`` wake-up (a
replica's readiness changed, a routed replica stopped) and the ``access`` wake-up (users, tokens or
members changed) clear them here and, on Postgres, on the other server replicas through ``NOTIFY``.
``ttl`` bounds how stale an entry may get should a notification be lost.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Cache(Generic[K, V]):
    """Entries for ``ttl`` seconds; concurrent misses of one key share one load."""

    def __init__(self, load: Callable[[K], Awaitable[V]], ttl: float, size: int = 10_000) -> None:
        self._load = load
        self.ttl = ttl
        self.size = size
        self._entries: dict[K, tuple[float, V]] = {}
        self._loading: dict[K, asyncio.Future[V]] = {}
        self._generation = 0
        #: Loads done (cache misses): the benchmark counts them.
        self.misses = 0

    def clear(self) -> None:
        self._entries.clear()
        self._generation += 1  # a load in flight when cleared is not kept

    def forget(self, key: K) -> None:
        """Drop one entry (the next ``get`` loads it again)."""
        self._entries.pop(key, None)

    async def get(self, key: K) -> V:
        hit = self._entries.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        pending = self._loading.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._loading[key] = fut
        generation = self._generation
        try:
            self.misses += 1
            value = await self._load(key)
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # retrieved: no "never retrieved" warning when nobody else waits
            raise
        finally:
            self._loading.pop(key, None)
        if generation == self._generation:
            if len(self._entries) >= self.size:
                self._entries.clear()
            self._entries[key] = (time.monotonic() + self.ttl, value)
        fut.set_result(value)
        return value
