"""A write transaction's events are inserted together just before it commits: all of them, in the order they
were recorded, with their targets; none when the transaction fails; at once on a connection that defers
nothing. On SQLite they, and a job's output lines, go by the driver itself, read back as written, and a clash is
still a Conflict."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from corral.domain.events import user_target
from corral.store import deferred
from corral.store import events as event_store
from corral.store import runs as run_store
from corral.store.db import Database
from corral.store.errors import Conflict
from corral.store.migrate import upgrade
from corral.store.tables import event_targets, events


async def _messages(db: Database) -> list[str]:
    async with db.read() as conn:
        q = sa.select(events.c.message).order_by(events.c.recorded_at)
        return [r.message for r in await conn.execute(q)]


async def test_a_transactions_events_are_written_at_its_commit_in_order(db_url: str) -> None:
    db = Database(db_url)
    await upgrade(db)
    async with db.write() as conn:
        for n in range(5):
            await event_store.emit(conn, f"event {n}", None, [user_target(f"u{n}", f"user{n}")])
        # deferred: not in the database yet, even for the transaction's own reads
        assert (await conn.execute(sa.select(sa.func.count()).select_from(events))).scalar_one() == 0
    assert await _messages(db) == [f"event {n}" for n in range(5)]
    async with db.read() as conn:
        names = sorted(r.entity_name for r in await conn.execute(sa.select(event_targets.c.entity_name)))
    assert names == [f"user{n}" for n in range(5)]
    await db.dispose()


async def test_a_failed_transaction_leaves_no_events(db_url: str) -> None:
    db = Database(db_url)
    await upgrade(db)
    with pytest.raises(RuntimeError):
        async with db.write() as conn:
            await event_store.emit(conn, "lost", None, [user_target("u", "user")])
            raise RuntimeError("the change fails")
    async with db.write() as conn:  # the connection's next transaction starts with nothing deferred
        await event_store.emit(conn, "kept", None, [user_target("u", "user")])
    assert await _messages(db) == ["kept"]
    await db.dispose()


async def test_a_connection_outside_a_write_transaction_inserts_at_once(db_url: str) -> None:
    db = Database(db_url)
    await upgrade(db)
    async with db.engine.begin() as conn:
        await event_store.emit(conn, "direct", None, [user_target("u", "user")])
        assert (await conn.execute(sa.select(sa.func.count()).select_from(events))).scalar_one() == 1
    assert await _messages(db) == ["direct"]
    await db.dispose()


async def test_a_row_that_clashes_at_the_commit_is_a_conflict(db_url: str) -> None:
    db = Database(db_url)
    await upgrade(db)
    row = {"id": "e1", "message": "once", "recorded_at": 1.0, "actor_user_id": None}
    async with db.write() as conn:
        await deferred.insert(conn, sa.insert(events), [row])
    with pytest.raises(Conflict):
        async with db.write() as conn:
            await deferred.insert(conn, sa.insert(events), [{**row, "message": "twice"}])
    assert await _messages(db) == ["once"]
    await db.dispose()


async def test_on_sqlite_the_rows_go_by_the_driver_itself(db_url: str) -> None:
    """SQLAlchemy executes no INSERT of events on SQLite: the driver does, rows naming other columns apart."""
    db = Database(db_url)
    await upgrade(db)
    seen: list[str] = []
    sa.event.listen(db.engine.sync_engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    async with db.write() as conn:
        await event_store.emit(conn, "with a user", "u", [user_target("u", "user")])
        await deferred.insert(conn, sa.insert(events), [{"id": "e9", "message": "no user", "recorded_at": 9.0}])
    async with db.read() as conn:
        got = {r.message: r.actor_user_id for r in await conn.execute(sa.select(events))}
    assert got == {"with a user": "u", "no user": None}
    inserts = [s for s in seen if s.lstrip().upper().startswith("INSERT INTO EVENT")]
    assert (inserts == []) if db.is_sqlite else (len(inserts) >= 2), seen  # Postgres: SQLAlchemy's, as before
    await db.dispose()


async def test_a_jobs_output_goes_by_the_driver_on_sqlite_and_reads_back_as_written(db_url: str) -> None:
    db = Database(db_url)
    await upgrade(db)
    seen: list[str] = []
    sa.event.listen(db.engine.sync_engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    lines = [(1.0000004, 1, b"out \xff\x00 bytes"), (2.5, 0, b""), (3.25, 1, "\u00e9t\u00e9\n".encode())]
    async with db.write() as conn:
        await run_store.append_logs(conn, "job-1", lines)
    async with db.read() as conn:
        got = await run_store.read_logs(conn, "job-1", None, 10)
    assert [(r.timestamp, r.source, r.message) for r in got] == [(1.0, 1, lines[0][2]), *lines[1:]]
    inserts = [s for s in seen if s.lstrip().upper().startswith("INSERT INTO LOGS")]
    assert (inserts == []) if db.is_sqlite else (len(inserts) == 1), seen
    await db.dispose()
