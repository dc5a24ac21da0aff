"""Draining, as this server replica sees it: which service replicas it holds (it may have requests in
flight to them, ``services.service_drains``), and their release once a replica left the route and its
last request here ended. A drained replica is stopped as soon as no server replica holds it, so a
rollout or a scale-down frees the replica's instance when its requests are done, not at the end of
``service_drain_timeout`` (which still bounds the wait).

``hold`` writes once per replica and server replica (before the first request to it), never per
request; a replica that left rotation meanwhile is refused, and the caller picks another."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from corral.context import Context
from corral.services import service_drains

log = logging.getLogger("corral.proxy")


class Drains:
    def __init__(self, ctx: Context, in_flight: Callable[[str], int]) -> None:
        self.ctx = ctx
        self._in_flight = in_flight
        self._held: set[str] = set()
        self._holding: dict[str, asyncio.Future[bool | None]] = {}
        self._leaving: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def hold(self, job_id: str) -> bool:
        """Whether requests may go to ``job_id`` (held: written before the first one)."""
        while job_id not in self._held:
            pending = self._holding.get(job_id)
            if pending is None:
                return await self._write_hold(job_id)
            got = await asyncio.shield(pending)
            if got is not None:
                return got
            # the request that was writing it went away first: this one writes it
        return True

    async def _write_hold(self, job_id: str) -> bool:
        fut: asyncio.Future[bool | None] = asyncio.get_running_loop().create_future()
        self._holding[job_id] = fut
        ok: bool | None = None
        # its own task: a caller that goes away does not cancel the write mid-transaction
        write = asyncio.get_running_loop().create_task(service_drains.hold(self.ctx, job_id))
        write.add_done_callback(lambda t: self._written(job_id, t))
        try:
            ok = await asyncio.shield(write)
        except Exception:  # the database is unreachable: the request is served all the same (held next time)
            log.warning("could not record the route to replica job %s", job_id, exc_info=True)
            return True
        finally:
            self._holding.pop(job_id, None)
            fut.set_result(ok)
        return ok

    def _written(self, job_id: str, write: asyncio.Task[bool]) -> None:
        """The hold is recorded (also when the request that asked went away meanwhile)."""
        if not write.cancelled() and write.exception() is None and write.result():
            self._held.add(job_id)
            self._leaving.discard(job_id)

    def left(self, job_ids: Iterable[str]) -> None:
        """Replicas no longer in this server's route: released once nothing is in flight to them."""
        for job_id in job_ids:
            if job_id in self._held:
                self._leaving.add(job_id)
        self._release_idle()

    def finished(self, job_id: str) -> None:
        """A request to ``job_id`` ended."""
        if job_id in self._leaving and self._in_flight(job_id) == 0:
            self._release_idle()

    def _release_idle(self) -> None:
        idle = [j for j in self._leaving if self._in_flight(j) == 0]
        if not idle:
            return
        for j in idle:
            self._leaving.discard(j)
            self._held.discard(j)
        self.spawn(self._release(idle))

    def holds_any(self, job_ids: Iterable[str]) -> bool:
        return any(j in self._held for j in job_ids)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` beside the requests (kept referenced until it ends)."""
        task = asyncio.get_running_loop().create_task(work, name="corral-proxy-drains")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _release(self, job_ids: list[str]) -> None:
        try:
            await service_drains.release(self.ctx, job_ids)
        except Exception:  # the replica then waits out its drain timeout
            log.warning("could not release %d drained replica(s)", len(job_ids), exc_info=True)
