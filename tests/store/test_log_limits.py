"""Trimming a job's stored output to a size (SQLite and Postgres): the oldest entries go, the newest and the
agent's own lines stay, and what went is counted."""

from __future__ import annotations

from corral.domain.records import AGENT_LOG_SOURCE
from corral.store import log_limits
from corral.store import runs as run_store
from corral.store.db import Database
from corral.store.migrate import upgrade


async def test_trim_keeps_the_newest_output_and_the_agents_lines(db_url: str) -> None:
    db = Database(db_url)
    try:
        await upgrade(db)
        async with db.write() as conn:
            entries = [(float(i), i % 2, b"%09d\n" % i) for i in range(100)]  # 10 bytes each
            await run_store.append_logs(conn, "j", entries[:50])
            await run_store.append_logs(conn, "j", [(50.0, AGENT_LOG_SOURCE, b"agent line\n")])  # 11 bytes
            await run_store.append_logs(conn, "j", entries[50:])
            await run_store.append_logs(conn, "other", entries[:3])
        async with db.write() as conn:
            assert await log_limits.stored_bytes(conn, "j") == 1011
            trimmed = await log_limits.trim(conn, "j", keep=255)
            assert (trimmed.entries, trimmed.size, trimmed.kept) == (75, 750, 261)
            assert await log_limits.trim(conn, "j", keep=255) == log_limits.Trimmed(0, 0, 261)
        async with db.read() as conn:
            left = await run_store.read_logs(conn, "j", None, 1000)
            assert [r.message for r in left] == [b"%09d\n" % i for i in range(75, 100)]
            (agent,) = await run_store.read_logs(conn, "j", None, 1000, diagnose=True)
            assert agent.message == b"agent line\n"
            assert await log_limits.stored_bytes(conn, "other") == 30
    finally:
        await db.dispose()
