"""Wake-ups across server replicas on Postgres: ``LISTEN``/``NOTIFY`` on one channel.

Each replica keeps one dedicated asyncpg connection that listens; ``notify`` coalesces the worker names
woken during one event-loop moment into a single ``NOTIFY`` (payload: ``<replica id>|name,name``), and
a replica ignores its own notifications (it has already woken its workers in process).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("corral.notify")
CHANNEL = "corral_wake"


def asyncpg_dsn(sqlalchemy_url: str) -> str:
    return sqlalchemy_url.replace("postgresql+asyncpg://", "postgresql://", 1)


class PgNotifier:
    def __init__(self, url: str, replica_id: str, on_remote: Callable[[list[str]], None]) -> None:
        self.dsn = asyncpg_dsn(url)
        self.replica_id = replica_id
        self.on_remote = on_remote
        self._conn: Any = None
        self._pending: set[str] = set()
        self._flush: asyncio.Task[None] | None = None

    async def start(self) -> None:
        import asyncpg

        self._conn = await asyncpg.connect(self.dsn)
        await self._conn.add_listener(CHANNEL, self._received)

    def _received(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        sender, _, names = payload.partition("|")
        if sender != self.replica_id and names:
            self.on_remote(names.split(","))

    def notify(self, names: tuple[str, ...]) -> None:
        if self._conn is None:
            return
        self._pending.update(names)
        if self._flush is None or self._flush.done():
            self._flush = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        await asyncio.sleep(0)  # gather the wakes of this moment into one NOTIFY
        names, self._pending = sorted(self._pending), set()
        if not names or self._conn is None:
            return
        try:
            await self._conn.execute("SELECT pg_notify($1, $2)", CHANNEL, f"{self.replica_id}|{','.join(names)}")
        except Exception as e:  # the safety-net pass still runs; say why wake-ups degrade
            log.warning("NOTIFY failed: %s", e)

    async def close(self) -> None:
        if self._flush is not None:
            with contextlib.suppress(Exception):
                await self._flush
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = None
