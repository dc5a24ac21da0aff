"""The kept run counts (``run_counts``) stay equal to a ``GROUP BY`` over the runs through a seeded random
sequence of inserts, status changes (one run by id with or without the status it must be in, several at once,
illegal ones refused and rolled back), deletes and a rejected savepoint, on SQLite and Postgres, with events
kept and without; and migration 0032 fills them from the runs already there."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
import sqlalchemy as sa

from corral.domain.statuses import IllegalTransition
from corral.store import deferred, run_counts
from corral.store import runs as run_store
from corral.store.db import Database
from corral.store.events import tracked_update
from corral.store.migrate import alembic_config, upgrade
from corral.store.tables import projects, runs, users

#: The run statuses of dstack 0.22.5's API, as the test knows them.
STATUSES = ("pending", "submitted", "provisioning", "running", "terminating", "terminated", "failed", "done")
ACTIVE = ("submitted", "provisioning", "running")

#: One statement, so that Postgres reads both sides in one snapshot: the kept counts and the recount.
COMPARE = sa.text(
    "SELECT 'kept', project_id, user_id, status, count FROM run_counts WHERE count <> 0 "
    "UNION ALL SELECT 'recount', project_id, user_id, status, COUNT(*) FROM runs "
    "GROUP BY project_id, user_id, status"
)


async def _both(db: Database) -> tuple[dict[tuple[str, str, str], int], dict[tuple[str, str, str], int]]:
    kept: dict[tuple[str, str, str], int] = {}
    recount: dict[tuple[str, str, str], int] = {}
    async with db.read() as conn:
        for side, project_id, user_id, status, n in await conn.execute(COMPARE):
            (kept if side == "kept" else recount)[(project_id, user_id, status)] = int(n)
    return kept, recount


async def _people(db: Database, now: float) -> None:
    async with db.write() as conn:
        for uid in ("u1", "u2"):
            await conn.execute(
                sa.insert(users).values(
                    id=uid, name=f"name-{uid}", token=uid, token_hash=uid, global_role="user", active=True,
                    deleted=False, created_at=now,
                )
            )  # fmt: skip
        for pid in ("p1", "p2"):
            await conn.execute(
                sa.insert(projects).values(
                    id=pid, name=f"name-{pid}", owner_id="u1", created_at=now, is_public=False, deleted=False,
                    backends="[]",
                )
            )  # fmt: skip


def _run_values(rng: random.Random, n: int, now: float) -> dict[str, Any]:
    return {
        "id": f"r{n}", "project_id": rng.choice(("p1", "p2")), "user_id": rng.choice(("u1", "u2")),
        "run_name": f"run-{n}", "submitted_at": now, "last_processed_at": now,
        "status": rng.choice(("submitted", "pending")), "run_spec": '{"configuration": {"type": "task"}}',
        "priority": 0, "deployment_num": 0,
    }  # fmt: skip


async def _step(db: Database, rng: random.Random, n: int, ids: list[str]) -> None:
    """One transaction of a random kind."""
    now = time.time()
    kind = rng.choice(("insert", "insert", "by_id", "by_id", "many", "delete", "illegal", "savepoint"))
    if kind == "insert" or not ids:
        values = _run_values(rng, n, now)
        async with db.write() as conn:
            await run_store.insert_run(conn, values)
        ids.append(values["id"])
        return
    run_id = rng.choice(ids)
    async with db.read() as conn:
        old = (await conn.execute(sa.select(runs.c.status).where(runs.c.id == run_id))).scalar_one()
    if kind == "by_id":
        new = rng.choice(STATUSES)
        expect = rng.choice((None, (old,), (old, "submitted")))
        try:
            async with db.write() as conn:
                await run_store.update_run(conn, run_id, {"status": new, "last_processed_at": now}, expect)
        except IllegalTransition:
            pass  # refused: the transaction rolled back
    elif kind == "many":  # a stop of every active run of one project, as a user's stop of several
        async with db.write() as conn:
            where = sa.and_(runs.c.project_id == rng.choice(("p1", "p2")), runs.c.status.in_(ACTIVE))
            await tracked_update(conn, runs, where, {"status": "terminating"})
    elif kind == "delete":
        async with db.write() as conn:
            await run_store.mark_runs_deleted(conn, [run_id])
    elif kind == "illegal":  # a legal change, then an illegal one in the same transaction: neither stays
        with pytest.raises(IllegalTransition):
            async with db.write() as conn:
                await run_store.update_run(conn, run_id, {"status": "terminated"}, None)
                await run_store.update_run(conn, run_id, {"status": "running"}, None)
    elif old in ACTIVE:  # a change in a savepoint that rolls back (a rejected gang): it counts nothing
        async with db.write() as conn:
            at = deferred.mark(conn)
            savepoint = await conn.begin_nested()
            await run_store.update_run(conn, run_id, {"status": "terminating"}, None)
            await savepoint.rollback()
            deferred.drop_since(conn, at)


@pytest.mark.parametrize("events_ttl", [30 * 24 * 3600.0, 0.0], ids=["events", "no-events"])
async def test_kept_counts_equal_a_recount_through_random_changes(db_url: str, events_ttl: float) -> None:
    db = Database(db_url, events_ttl=events_ttl)
    await upgrade(db)
    await _people(db, time.time())
    rng, ids = random.Random(47), list[str]()
    for n in range(120):
        await _step(db, rng, n, ids)
        kept, recount = await _both(db)
        assert kept == recount, f"after step {n}"
    kept, _ = await _both(db)
    async with db.write() as conn:  # a recount from the runs (a bulk load's) gives the same counts
        await run_counts.recount(conn)
    assert (await _both(db))[0] == kept
    assert sum(kept.values()) == len(ids) and len({s for _, _, s in kept}) >= 4  # the loop went somewhere
    async with db.read() as conn:
        by_name = await run_counts.by_status(conn)
    assert sum(sum(v.values()) for v in by_name.values()) == len(ids)
    assert set(by_name) <= {(f"name-{p}", f"name-{u}") for p in ("p1", "p2") for u in ("u1", "u2")}
    await db.dispose()


async def test_a_count_change_is_prepared_once(db_url: str) -> None:
    """The counts' statement is never compiled per transaction (a dialect's ``on_conflict_do_update`` has no
    cache key, and compiling it was most of a short transaction's CPU): on SQLite the driver runs it itself,
    on Postgres SQLAlchemy compiles it once and serves it from its cache after."""
    db = Database(db_url)
    await upgrade(db)
    await _people(db, time.time())
    seen: list[tuple[str, str]] = []

    def record(_conn: Any, _cursor: Any, statement: str, _params: Any, context: Any, _many: bool) -> None:
        if "run_counts" in statement:
            seen.append((statement, str(context.cache_hit)))

    sa.event.listen(db.engine.sync_engine, "after_cursor_execute", record)
    async with db.write() as conn:
        await run_store.insert_run(conn, {**_run_values(random.Random(1), 0, time.time()), "status": "submitted"})
    for new in ("provisioning", "running", "done"):
        async with db.write() as conn:
            await run_store.update_run(conn, "r0", {"status": new}, None)
    sa.event.remove(db.engine.sync_engine, "after_cursor_execute", record)
    kept, recount = await _both(db)
    assert kept == recount and list(kept.values()) == [1] and next(iter(kept))[2] == "done", kept
    if db.is_sqlite:
        assert seen == []  # by the driver
    else:
        # one statement; compiled for one row (the insert) and for several (a change: two counts), then cached
        assert len(seen) == 4 and len({statement for statement, _ in seen}) == 1, seen
        assert [hit for _, hit in seen[2:]] == ["CacheStats.CACHE_HIT"] * 2, seen
    await db.dispose()


async def test_0032_fills_the_counts_from_the_runs_there(db_url: str) -> None:
    from alembic import command

    db = Database(db_url)

    def to(rev: str) -> Any:
        def run(sync_conn: sa.Connection) -> None:
            cfg = alembic_config()
            cfg.attributes["connection"] = sync_conn
            command.upgrade(cfg, rev)

        return run

    async with db.engine.connect() as conn:
        await conn.run_sync(to("0026"))
        await conn.commit()
    await _people(db, 0.0)
    rows = [("p1", "u1", "done"), ("p1", "u1", "done"), ("p1", "u2", "failed"), ("p2", "u1", "running")]
    async with db.write() as conn:
        for n, (pid, uid, status) in enumerate(rows):
            await conn.execute(
                sa.text(
                    "INSERT INTO runs (id, project_id, user_id, run_name, submitted_at, last_processed_at, status, "
                    "run_spec, priority, deployment_num, deleted) "
                    "VALUES (:id, :p, :u, :id, 0, 0, :s, '{}', 0, 0, :d)"
                ),
                {"id": f"r{n}", "p": pid, "u": uid, "s": status, "d": n == 0},
            )
    async with db.engine.connect() as conn:
        await conn.run_sync(to("head"))
        await conn.commit()
    kept, recount = await _both(db)
    assert kept == recount == {("p1", "u1", "done"): 2, ("p1", "u2", "failed"): 1, ("p2", "u1", "running"): 1}
    await db.dispose()
