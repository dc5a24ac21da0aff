"""Keep-alive connections to replicas: idle ones kept per replica (job id) and reused, new ones opened
through the backend's channel to the host; those of replicas no longer routed to are closed (dstack
keeps them for ever, #2238)."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Collection
from typing import Any

Conn = tuple[Any, Any]
#: Idle connections kept per replica.
MAX_IDLE = 64


def _usable(conn: Conn) -> bool:
    reader, writer = conn
    closing = getattr(writer, "is_closing", None)
    if closing is not None and closing():
        return False
    at_eof = getattr(reader, "at_eof", None)
    return not (at_eof is not None and at_eof())


def close(conn: Conn) -> None:
    with contextlib.suppress(Exception):
        conn[1].close()


class Pool:
    def __init__(self) -> None:
        self._idle: dict[str, list[Conn]] = {}

    async def acquire(self, job_id: str, dial: Callable[[], Awaitable[Conn]]) -> tuple[Conn, bool]:
        """An idle connection to the replica (``True``: reused), or a new one."""
        idle = self._idle.get(job_id)
        while idle:
            conn = idle.pop()
            if _usable(conn):
                return conn, True
            close(conn)
        return await dial(), False

    def release(self, job_id: str, conn: Conn) -> None:
        idle = self._idle.setdefault(job_id, [])
        if len(idle) < MAX_IDLE and _usable(conn):
            idle.append(conn)
        else:
            close(conn)

    def drop(self, job_id: str) -> None:
        for conn in self._idle.pop(job_id, ()):
            close(conn)

    def keep_only(self, live: Collection[str]) -> None:
        for job_id in [j for j in self._idle if j not in live]:
            for conn in self._idle.pop(job_id):
                close(conn)

    def idle_count(self) -> int:
        return sum(len(v) for v in self._idle.values())

    def close_all(self) -> None:
        self.keep_only(())
