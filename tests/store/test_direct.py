"""Statements built once, run by SQLite's driver itself (``store/direct.py``): the same rows, rowcounts, defaults and
errors as through SQLAlchemy, on SQLite and on Postgres; and on SQLite no SQLAlchemy execution at all."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from corral.store import direct, prebuilt
from corral.store import runs as run_store
from corral.store.db import Database
from corral.store.errors import Conflict
from corral.store.migrate import upgrade
from corral.store.tables import jobs, logs, runs
from store_rows import a_run, admin_and_project

#: Statements built once, as the store builds its hot ones.
_RUN = sa.select(runs.c.id, runs.c.status, runs.c.deleted, runs.c.stop_on_master_done, runs.c.priority).where(
    runs.c.id == sa.bindparam("_id")
)
_STATUSES = sa.select(runs.c.id).where(runs.c.status.in_([sa.literal("running"), sa.literal("pending")]))
_COUNT = sa.select(sa.func.count()).select_from(runs).where(runs.c.project_id == sa.bindparam("_id"))
_EXPANDING = sa.select(runs.c.id).where(runs.c.id.in_(sa.bindparam("ids", expanding=True))).order_by(runs.c.id)


async def _db(url: str) -> Database:
    db = Database(url)
    await upgrade(db)
    now = time.time()
    async with db.write() as conn:
        await admin_and_project(conn, now)
        await a_run(conn, "r1", now, status="running")
        await a_run(conn, "r2", now, status="done")
    return db


def _sqlalchemy_statements(db: Database) -> list[str]:
    """Every statement SQLAlchemy executes on ``db`` from now on."""
    seen: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_: Any) -> None:
        seen.append(statement)

    sa.event.listen(db.engine.sync_engine, "after_cursor_execute", record)
    return seen


async def test_rows_rowcounts_and_types_as_sqlalchemy_gives_them(db_url: str) -> None:
    db = await _db(db_url)
    seen = _sqlalchemy_statements(db)
    update = prebuilt.update_returning(runs, frozenset({"status", "stop_on_master_done"}), ("run_name", "deleted"))
    async with db.write() as conn:
        got = (await direct.execute(conn, _RUN, {"_id": "r1"})).first()
        assert (got.id, got.status, got.deleted, got.stop_on_master_done, got.priority) == (
            "r1",
            "running",
            False,
            None,
            0,
        )
        assert got.deleted is False  # a Boolean column read back as a bool, not SQLite's 0
        assert got._mapping["status"] == "running"
        assert (await direct.execute(conn, _RUN, {"_id": "nope"})).first() is None
        assert [r.id for r in (await direct.execute(conn, _STATUSES)).all()] == ["r1"]
        assert (await direct.execute(conn, _COUNT, {"_id": "p"})).scalar_one() == 2
        values = {"status": "terminating", "stop_on_master_done": True}
        returned = await direct.execute(conn, update, prebuilt.params("r1", values, ("running",)))
        row = returned.first()
        assert (row.run_name, row.deleted) == ("r1", False) and returned.rowcount == 1
        again = await direct.execute(conn, update, prebuilt.params("r1", values, ("running",)))
        assert again.first() is None and again.rowcount == 0  # no longer running
        plain = prebuilt.update_by_id(runs, frozenset({"priority"}), None)
        assert (await direct.execute(conn, plain, prebuilt.params("r2", {"priority": 7}))).rowcount == 1
        # an expanding IN is rendered at each execution: it goes through SQLAlchemy, and reads the same
        assert [r.id for r in await direct.execute(conn, _EXPANDING, {"ids": ["r2", "r1"]})] == ["r1", "r2"]
        at_commit = len(seen)
    async with db.read() as conn:
        stored = (
            await conn.execute(sa.select(runs.c.status, runs.c.stop_on_master_done).where(runs.c.id == "r1"))
        ).one()
        assert tuple(stored) == ("terminating", True)
    through_sqlalchemy = [s for s in seen[:at_commit] if "runs" in s.lower()]
    if db.is_sqlite:  # every statement above but the expanding one went by the driver
        assert len(through_sqlalchemy) == 1 and " IN (?, ?)" in through_sqlalchemy[0], through_sqlalchemy
    else:
        assert len(through_sqlalchemy) == 8, through_sqlalchemy  # all of them
    await db.dispose()


async def test_insert_gives_defaults_and_a_taken_key_is_a_conflict(db_url: str) -> None:
    db = await _db(db_url)
    now = time.time()
    run = {
        "id": "r3", "project_id": "p", "user_id": "u", "run_name": "three", "submitted_at": now,
        "last_processed_at": now, "status": "submitted", "run_spec": "{}",
    }  # fmt: skip
    job = {
        "id": "j1", "run_id": "r3", "project_id": "p", "run_name": "three", "job_num": 0, "job_name": "three-0",
        "submitted_at": now, "last_processed_at": now, "status": "submitted", "job_spec": "{}", "ready": False,
    }  # fmt: skip
    async with db.write() as conn:
        await direct.insert(conn, runs, sa.insert(runs), [run])
        await direct.insert(conn, jobs, sa.insert(jobs), [job, {**job, "id": "j2", "job_num": 1, "ready": None}])
    async with db.read() as conn:
        got = (await conn.execute(sa.select(runs.c.priority, runs.c.deleted).where(runs.c.id == "r3"))).one()
        assert tuple(got) == (0, False)  # the columns' defaults, as SQLAlchemy's insert gives them
        q = sa.select(jobs.c.id, jobs.c.blocks, jobs.c.log_offset, jobs.c.ready).order_by(jobs.c.id)
        assert [tuple(r) for r in await conn.execute(q)] == [("j1", 1, 0, False), ("j2", 1, 0, None)]
    with pytest.raises(Conflict):
        async with db.write() as conn:
            await direct.insert(conn, runs, sa.insert(runs), [{**run, "id": "r4"}])  # the same live run name
    async with db.read() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(runs))).scalar_one() == 3
    await db.dispose()


async def test_a_few_ids_by_the_driver_read_as_many_ids_do(db_url: str) -> None:
    """The jobs worker's reads of the few jobs a placement handed over (their runs, their jobs, their instances'
    ids bound one parameter each) give the records a read of many ids gives (an expanding ``IN``)."""
    db = await _db(db_url)
    now = time.time()
    many = [f"m{i:02}" for i in range(prebuilt.LISTED + 2)]
    async with db.write() as conn:
        for i, run_id in enumerate(many):
            await a_run(conn, run_id, now + i)
            job = {
                "id": f"j-{run_id}", "run_id": run_id, "project_id": "p", "run_name": run_id, "job_num": 0,
                "job_name": f"{run_id}-0", "submitted_at": now + i, "last_processed_at": now + i,
                "status": "running" if i % 2 else "submitted", "job_spec": "{}", "ready": i == 3 if i < 10 else None,
            }  # fmt: skip
            await direct.insert(conn, jobs, sa.insert(jobs), [job])
    few = [many[3], many[0]]
    seen = _sqlalchemy_statements(db)  # the write engine's: read on it
    async with db.write() as conn:
        by_few = await run_store.runs_by_ids(conn, few)
        jobs_few = await run_store.list_jobs(conn, ("running", "submitted"), ids=[f"j-{r}" for r in few])
        through_sqlalchemy = len(seen)
        by_many = await run_store.runs_by_ids(conn, many)
        jobs_many = await run_store.list_jobs(conn, ("running", "submitted"), ids=[f"j-{r}" for r in many])
        assert await run_store.list_jobs(conn, ("running",), ids=[]) == []
    assert set(by_few) == set(few) and all(by_few[r] == by_many[r] for r in few)
    assert [j.id for j in jobs_few] == ["j-m00", "j-m03"]  # oldest first
    assert jobs_few == [j for j in jobs_many if j.run_id in few]
    assert [j.ready for j in jobs_few] == [False, True]  # a Boolean column read back as SQLAlchemy reads it
    if db.is_sqlite:
        assert through_sqlalchemy == 0, seen
    assert len(seen) > through_sqlalchemy  # many ids: through SQLAlchemy
    await db.dispose()


async def test_a_default_computed_at_execution_is_refused_by_name(tmp_path: Path) -> None:
    """A column whose default SQLAlchemy computes at execution cannot be filled in by the driver's insert: it says
    which, rather than inserting a row without it."""
    db = await _db(f"sqlite+aiosqlite:///{tmp_path / 'c.db'}")
    computed = sa.Table("computed", sa.MetaData(), sa.Column("id", sa.String, primary_key=True, default=lambda: "x"))
    with pytest.raises(TypeError, match=r"computed\.id: its default is not a value"):
        async with db.write() as conn:
            await direct.insert(conn, computed, sa.insert(computed), [{}])
    await db.dispose()


async def test_an_onupdate_computed_at_execution_is_left_to_sqlalchemy(tmp_path: Path) -> None:
    """An UPDATE whose column's ``onupdate`` SQLAlchemy computes at execution (a Python value, not SQL) is run by
    SQLAlchemy, which sets it, rather than by the driver, which would write nothing there."""
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'c.db'}")
    counted = sa.Table(
        "counted",
        sa.MetaData(),
        sa.Column("id", sa.String, primary_key=True),
        sa.Column("name", sa.String),
        sa.Column("touched", sa.Integer, onupdate=lambda: 7),
    )
    update = counted.update().where(counted.c.id == sa.bindparam("_id")).values(name=sa.bindparam("_name"))
    async with db.write() as conn:
        await conn.run_sync(lambda sync: counted.create(sync))
        await conn.execute(counted.insert().values(id="a", name="x", touched=0))
        assert (await direct.execute(conn, update, {"_id": "a", "_name": "y"})).rowcount == 1
    async with db.read() as conn:
        got = (await conn.execute(sa.select(counted.c.name, counted.c.touched))).one()
    assert tuple(got) == ("y", 7)
    await db.dispose()


async def test_a_followed_jobs_output_is_kept_only_under_its_lease(db_url: str) -> None:
    """The follower's write of a job's output and offset: kept under the job's lease token, refused (nothing
    written) under another; on SQLite by the driver, with no SQLAlchemy execution."""
    db = await _db(db_url)
    now = time.time()
    job = {
        "id": "j1", "run_id": "r1", "project_id": "p", "run_name": "r1", "job_num": 0, "job_name": "r1-0",
        "submitted_at": now, "last_processed_at": now, "status": "running", "job_spec": "{}", "log_offset": 0,
        "lock_token": "held", "disconnected_at": now,
    }  # fmt: skip
    async with db.write() as conn:
        await direct.insert(conn, jobs, sa.insert(jobs), [job])
    seen = _sqlalchemy_statements(db)
    async with db.write() as conn:
        assert await run_store.append_logs_guarded(conn, "j1", "held", [(now, 1, b"ok\n")], 3)
        assert not await run_store.append_logs_guarded(conn, "j1", "lost", [(now, 1, b"again\n")], 9)
        through_sqlalchemy = [s for s in seen if "jobs" in s.lower() or "logs" in s.lower()]
    async with db.read() as conn:
        got = (await conn.execute(sa.select(jobs.c.log_offset, jobs.c.disconnected_at).where(jobs.c.id == "j1"))).one()
        kept = [r.message for r in await conn.execute(sa.select(logs.c.message).where(logs.c.job_id == "j1"))]
    assert tuple(got) == (3, None) and kept == [b"ok\n"]
    if db.is_sqlite:
        assert through_sqlalchemy == [], through_sqlalchemy
    await db.dispose()
