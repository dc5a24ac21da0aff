"""A tracked update records its row's status change as an event of the same transaction: read-then-update, or
(a row that must be in one status) one ``UPDATE ... RETURNING``; either way the same event, the row as it was,
and nothing where the row is not in the status expected."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store import direct
from corral.store import events as event_store
from corral.store.db import Database
from corral.store.migrate import upgrade
from corral.store.tables import event_targets, events, runs
from store_rows import a_run, admin_and_project


async def _db(url: str) -> Database:
    db = Database(url)
    await upgrade(db)
    now = time.time()
    async with db.write() as conn:
        await admin_and_project(conn, now)
        for run_id in ("r1", "r2"):
            await a_run(conn, run_id, now, status="running", name=f"name-{run_id}")
    return db


async def _events(db: Database) -> list[tuple[str, str]]:
    async with db.read() as conn:
        q = (
            sa.select(events.c.message, event_targets.c.entity_name)
            .join(event_targets, event_targets.c.event_id == events.c.id)
            .order_by(events.c.recorded_at)
        )
        return [(r.message, r.entity_name) for r in await conn.execute(q)]


@pytest.mark.parametrize("expect", [("running",), ("running", "pending")], ids=["returning", "read-then-update"])
async def test_a_tracked_update_records_the_change_and_gives_the_row_as_it_was(
    db_url: str, expect: tuple[str, ...]
) -> None:
    db = await _db(db_url)
    values = {"status": "done", "termination_reason": "all_jobs_done", "last_processed_at": time.time()}
    async with db.write() as conn:
        row = await event_store.tracked_update_row(conn, runs, "r1", values, expect_status=expect)
    assert row is not None
    assert (row.id, row.status, row.project_id, row.run_name) == ("r1", "running", "p", "name-r1")
    async with db.write() as conn:  # no longer running: nothing changes, nothing is recorded
        failed = {"status": "failed"}
        assert await event_store.tracked_update_row(conn, runs, "r1", failed, expect_status=expect) is None
        assert not await event_store.tracked_update_by_id(conn, runs, "missing", values, expect_status=expect)
    async with db.read() as conn:
        got = (await conn.execute(sa.select(runs.c.status, runs.c.termination_reason).where(runs.c.id == "r1"))).one()
    assert tuple(got) == ("done", "all_jobs_done")
    recorded = await _events(db)
    assert len(recorded) == 1 and recorded[0][1] == "name-r1", recorded
    assert "RUNNING" in recorded[0][0] and "DONE" in recorded[0][0] and "ALL_JOBS_DONE" in recorded[0][0]
    await db.dispose()


async def test_both_ways_record_the_same_event(db_url: str) -> None:
    db = await _db(db_url)
    values = {"status": "terminating", "termination_reason": "stopped_by_user"}
    async with db.write() as conn:
        assert await event_store.tracked_update_by_id(conn, runs, "r1", values, expect_status=("running",))
        assert await event_store.tracked_update_by_id(conn, runs, "r2", values, expect_status=("running", "pending"))
    (one, _), (two, _) = await _events(db)
    assert one == two, (one, two)
    await db.dispose()


_ONE_RUN = ("UPDATE RUNS", "SELECT RUNS.ID")


async def test_statements_of_one_row_go_as_compiled(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row's statements (its statuses expected bound one parameter each) are sent as SQLAlchemy compiled and
    cached them: no statement text is rendered again at each execution, as an expanding ``IN`` parameter has it.
    On SQLite they go to its driver itself (``store/direct.py``), none through SQLAlchemy's execution."""
    by_sqlalchemy: list[tuple[str, str]] = []  # (the text sent, the statement's compiled text)
    by_driver: list[tuple[str, str]] = []

    def record(_conn: object, _cursor: object, statement: str, _params: object, context: object, _many: bool) -> None:
        compiled = getattr(context, "compiled", None)
        if compiled is not None and statement.lstrip().upper().startswith(_ONE_RUN):
            by_sqlalchemy.append((statement, compiled.string))

    db = await _db(db_url)
    sa.event.listen(db.engine.sync_engine, "after_cursor_execute", record)
    given: list[sa.Executable] = []  # the statements handed to the driver's seam, latest last
    execute = direct.execute

    async def spied(conn: AsyncConnection, stmt: sa.Executable, params: Mapping[str, Any] | None = None) -> Any:
        given.append(stmt)
        return await execute(conn, stmt, params)

    monkeypatch.setattr(direct, "execute", spied)
    values = {"status": "terminating", "termination_reason": "stopped_by_user"}
    async with db.write() as conn:
        if db.is_sqlite:  # what reaches SQLite's driver, beside the compiled text of the statement it came from
            _watch_driver(monkeypatch, conn, given, by_driver)
        assert await event_store.tracked_update_by_id(conn, runs, "r1", values, expect_status=("running",))
        assert await event_store.tracked_update_by_id(conn, runs, "r2", values, expect_status=("running", "pending"))
        assert not await event_store.tracked_update_by_id(conn, runs, "r2", {"status": "failed"}, expect_status=())
    sent = by_sqlalchemy + by_driver
    assert len(sent) >= 3 and all(statement == compiled for statement, compiled in sent), sent
    if db.is_sqlite:
        assert by_sqlalchemy == [], by_sqlalchemy
    await db.dispose()


def _watch_driver(
    monkeypatch: pytest.MonkeyPatch, conn: AsyncConnection, given: list[sa.Executable], out: list[tuple[str, str]]
) -> None:
    """Record each statement of one run that ``conn``'s SQLite driver is given, with the compiled text of the
    statement last handed to ``store/direct.py``."""
    driver = direct.driver(conn)
    for name in ("execute", "execute_fetchall"):
        method = getattr(driver, name)

        async def recording(sql: str, parameters: Any = None, *, _method: Any = method) -> Any:
            if sql.lstrip().upper().startswith(_ONE_RUN):
                compiled: Any = given[-1].compile(dialect=conn.dialect)  # type: ignore[attr-defined]
                out.append((sql, compiled.string))
            return await _method(sql, parameters)

        monkeypatch.setattr(driver, name, recording)
