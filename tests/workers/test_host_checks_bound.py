"""Health checks of many hosts at once: a check waits for its turn before its timeout starts, so hosts that
answer in time are not flagged unreachable for having queued behind the others.

Thousands of SSH hosts checked all at once made one round longer than the request timeout on a busy server
(each exchange goes through the host's SSH tunnel, all on the server's one loop): healthy hosts were flagged
and bootstrapped again. Here the far end is a real agent behind a proxy that serves a few connections at a
time, each taking a while: checked all at once, the checks at the back time out waiting for the proxy; taken
in turns, each answers within its timeout.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from corral.agent.server import Agent
from corral.context import Context
from corral.settings import Settings
from corral.store.db import Database
from corral.store.migrate import upgrade
from corral.store.tables import fleets, instances
from corral.workers.hosts import Hosts
from store_rows import admin_and_project

TOKEN = "checks0token"
HOSTS = 192
#: Connections the proxy serves at once (room for the checks' turns and the client's idle keep-alive ones),
#: and how long each waits before it is forwarded.
PROXY_SLOTS = 48
PROXY_DELAY = 0.3
#: The checks' request timeout: one check's exchange takes PROXY_DELAY, all of them at once, in the proxy's
#: turns, take HOSTS / PROXY_SLOTS * PROXY_DELAY = 1.2 s.
TIMEOUT = 1.0
#: Long enough for a round of checks taken in turns (HOSTS / 32 * PROXY_DELAY = 1.8 s) on a busy machine.
ROUND_S = 5.0


class SlowProxy:
    """Forwards to ``target``, serving ``slots`` connections at a time, each after ``delay`` seconds; counts
    the health requests it forwarded."""

    def __init__(self, target: int, slots: int, delay: float) -> None:
        self.target, self.delay = target, delay
        self.slots = asyncio.Semaphore(slots)
        self.health_requests = 0
        self.port = 0

    async def start(self) -> asyncio.AbstractServer:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return server

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with self.slots:
            await asyncio.sleep(self.delay)
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
            except OSError:
                writer.close()
                return
            await asyncio.gather(self._pipe(reader, up_writer, count=True), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count: bool = False) -> None:
        try:
            while data := await reader.read(65536):
                self.health_requests += data.count(b"GET /health") if count else 0
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    a = Agent(str(tmp_path / "w"), TOKEN, idle_timeout=30)
    t = threading.Thread(target=a.serve_forever, daemon=True)
    t.start()
    yield a
    a.runner.shutdown()
    a.httpd.shutdown()
    t.join(10)


async def _seed(db: Database, url: str) -> None:
    now = time.time()
    async with db.write() as conn:
        await admin_and_project(conn, now)
        spec = {"configuration": {"type": "fleet", "name": "f", "nodes": HOSTS}}
        await conn.execute(
            sa.insert(fleets).values(
                id="f", project_id="p", name="f", created_at=now, last_processed_at=now, status="active",
                spec=json.dumps(spec), deleted=False,
            )
        )  # fmt: skip
        for n in range(HOSTS):
            await conn.execute(
                sa.insert(instances).values(
                    id=f"i{n}", project_id="p", fleet_id="f", name=f"f-{n}", instance_num=n, status="idle",
                    unreachable=False, backend="local", total_blocks=1, busy_blocks=0, created_at=now,
                    last_processed_at=now, deleted=False, agent=json.dumps({"url": url, "token": TOKEN}),
                )
            )  # fmt: skip


async def _flagged(db: Database) -> int:
    async with db.read() as conn:
        return len((await conn.execute(sa.select(instances.c.id).where(instances.c.unreachable))).all())


async def test_hosts_checked_together_answering_in_time_are_not_flagged(agent: Agent, tmp_path: Path) -> None:
    proxy = SlowProxy(agent.port, PROXY_SLOTS, PROXY_DELAY)
    server = await proxy.start()
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'c.db'}")
    await upgrade(db)
    await _seed(db, f"http://127.0.0.1:{proxy.port}")
    conf = Settings(server_dir=tmp_path, database_url=db.url, agent_request_timeout=TIMEOUT)
    hosts = Hosts(Context(conf, db, {}, replica_id="r"))
    try:
        for _round in (1, 2):  # two failed checks in a row flag a host
            await hosts.pass_once()
            await asyncio.sleep(ROUND_S)
        assert proxy.health_requests >= HOSTS
        assert await _flagged(db) == 0, "hosts that answered within the timeout were flagged unreachable"
    finally:
        await hosts.stop()
        server.close()
        await db.dispose()
