"""SQLite connections stay open between transactions (their checkout and return were most of a short
transaction's CPU): one that ended cleanly serves the next, one whose transaction failed is closed, at most
``KEEP_IDLE`` wait per engine, and ``dispose`` closes them. Postgres keeps its pool's own behaviour."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa

from corral.store.db import KEEP_IDLE, Database
from corral.store.migrate import upgrade
from corral.store.tables import projects


async def test_a_clean_transactions_connection_serves_the_next_and_a_failed_ones_is_closed(db_url: str) -> None:
    db = Database(db_url)
    await upgrade(db)
    async with db.read() as first:
        pass
    async with db.read() as second:
        assert (await second.execute(sa.select(sa.func.count()).select_from(projects))).scalar_one() >= 0
    if not db.is_sqlite:
        assert second is not first and db._idle == {}
        await db.dispose()
        return
    assert second is first, "the connection of a clean transaction is used again"
    with pytest.raises(RuntimeError):
        async with db.write() as failing:
            raise RuntimeError("the change fails")
    assert failing.closed and all(failing not in idle for idle in db._idle.values())
    async with db.write() as after:  # the next write gets a working connection
        assert after is not failing
        await after.execute(sa.text("SELECT 1"))
    # many at once: each gets a connection of its own, and no more than KEEP_IDLE stay open after
    opened = [db.read() for _ in range(KEEP_IDLE + 3)]
    conns = [await cm.__aenter__() for cm in opened]
    assert len({id(c) for c in conns}) == len(conns)
    for cm in opened:
        await cm.__aexit__(None, None, None)
    assert max(len(idle) for idle in db._idle.values()) == KEEP_IDLE
    await db.dispose()
    assert all(c.closed for c in conns) and all(not idle for idle in db._idle.values())


async def test_a_sqlite_write_transaction_holds_the_write_lock_from_its_begin_and_a_read_its_snapshot(
    tmp_path: Path,
) -> None:
    """``BEGIN IMMEDIATE`` (a write), ``BEGIN`` (a read), the commit and the rollback are made on SQLite's own
    connection where the statements run on the loop's thread: a write holds SQLite's write lock before its first
    statement and what it wrote is there for every connection once it ends, or nothing of it if it failed; a read
    keeps the rows as they were when it first read."""
    path = tmp_path / "corral.db"
    db = Database(f"sqlite+aiosqlite:///{path}")
    await upgrade(db)
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    count = "SELECT count(*) FROM projects"
    try:
        async with db.write() as conn:
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
            await conn.execute(
                sa.text(
                    "INSERT INTO users (id, name, token, token_hash, global_role, active, deleted, created_at) "
                    "VALUES ('u', 'u', 't', 'h', 'admin', 1, 0, 0)"
                )
            )
            await conn.execute(sa.text(_project("p1")))
        assert other.execute(count).fetchone() == (1,), "committed"
        with pytest.raises(RuntimeError):
            async with db.write() as conn:
                await conn.execute(sa.text(_project("p3")))
                raise RuntimeError("the change fails")
        assert other.execute(count).fetchone() == (1,), "rolled back"
        other.execute("BEGIN IMMEDIATE")  # the lock is free once the write ended
        other.execute("ROLLBACK")
        async with db.read() as conn:
            assert (await conn.execute(sa.text(count))).scalar_one() == 1
            other.execute(_project("p2"))
            assert (await conn.execute(sa.text(count))).scalar_one() == 1, "the read's snapshot"
        async with db.read() as conn:
            assert (await conn.execute(sa.text(count))).scalar_one() == 2
    finally:
        other.close()
        await db.dispose()


def _project(name: str) -> str:
    return (
        "INSERT INTO projects (id, name, owner_id, created_at, is_public, deleted, backends) "
        f"VALUES ('{name}', '{name}', 'u', 0, 0, 0, '[]')"
    )


async def test_sqlite_connections_checkpoint_every_4000_pages_and_keep_temporary_btrees_in_memory(
    tmp_path: Path,
) -> None:
    """The WAL is copied into the database at 4,000 pages, not SQLite's 1,000 (a job's rows, rewritten at each of
    its changes, copied and synced a quarter as often), and a statement's sort or statement journal stays in
    memory instead of a file made and removed under /var/tmp (``PRAGMA temp_store``: 2 is MEMORY)."""
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'corral.db'}")
    await upgrade(db)
    for begin in (db.write, db.read):
        async with begin() as conn:
            assert (await conn.execute(sa.text("PRAGMA wal_autocheckpoint"))).scalar_one() == 4000
            assert (await conn.execute(sa.text("PRAGMA temp_store"))).scalar_one() == 2
    await db.dispose()
