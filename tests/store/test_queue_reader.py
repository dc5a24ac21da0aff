"""The queue as a scheduling pass reads it: each read tells the jobs that came (read whole, once), the ones
whose priority or status message changed, and the ones that left; on SQLite and Postgres. A read goes on from
its mark in the log of the queue's changes (``queue_changes``, written by triggers) and agrees with a read of
the whole state."""

from __future__ import annotations

import random
import time
from typing import Any

import orjson
import pytest
import sqlalchemy as sa

from corral.domain.job_facts import JobFacts, WaitRule, decode, encode
from corral.domain.resources import Requirements
from corral.store import queue_reader
from corral.store.db import Database
from corral.store.migrate import upgrade
from corral.store.queue_reader import QueueChange, QueueReader
from corral.store.tables import jobs, queue_changes
from store_rows import a_run, admin_and_project

#: A job's scheduling facts as ``runs/apply`` writes them.
FACTS = encode(
    JobFacts(
        requirements=Requirements(), fleet_names=("gpus",), creation_policy="reuse-or-create", wait=WaitRule(),
        nodes=1, selectors=None, backends=None, regions=None, instance_types=None, max_price=None,
        spot_policy=None, reservation=None, volumes=(), has_image=False, run_type="task",
    )
)  # fmt: skip


async def _db(url: str) -> Database:
    db = Database(url)
    await upgrade(db)
    async with db.write() as conn:
        await admin_and_project(conn, time.time())
        await a_run(conn, "r", time.time())
    return db


def _job_values(job_id: str, job_num: int, submitted_at: float) -> dict[str, object]:
    return dict(
        id=job_id, run_id="r", project_id="p", run_name="r", job_num=job_num, replica_num=0, job_name=job_id,
        submission_num=0, deployment_num=0, submitted_at=submitted_at, last_processed_at=submitted_at,
        status="submitted", job_spec=f'{{"job_num": {job_num}}}', priority=0, blocks=1, log_offset=0,
    )  # fmt: skip


async def _job(db: Database, job_id: str, job_num: int, submitted_at: float) -> None:
    async with db.write() as conn:
        await conn.execute(sa.insert(jobs).values(**_job_values(job_id, job_num, submitted_at)))


async def _set(db: Database, job_id: str, **values: object) -> None:
    async with db.write() as conn:
        await conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(**values))


async def _read(db: Database, reader: QueueReader) -> QueueChange:
    async with db.read() as conn:
        return await reader.read(conn)


async def test_each_read_tells_what_came_changed_and_left(db_url: str) -> None:
    db = await _db(db_url)
    reader = QueueReader()
    await _job(db, "b", 1, 200.0)
    await _job(db, "a", 0, 100.0)
    first = await _read(db, reader)
    assert [r.id for r in first.fresh] == ["a", "b"]  # oldest first, with their documents
    assert [r.job_spec for r in first.fresh] == [{"job_num": 0}, {"job_num": 1}]
    assert first.fresh[0].run_spec == {} and first.fresh[0].submitter_role == "admin"
    assert first.changed == [] and first.gone == []
    assert reader.known == {"a": ("a", 0, None), "b": ("b", 0, None)}

    assert await _read(db, reader) == QueueChange([], [], [])  # nothing changed: nothing to handle

    await _set(db, "a", status_message="waiting for capacity", priority=5)
    await _set(db, "b", status="terminated")  # stopped: it left the queue
    await _job(db, "c", 2, 300.0)
    change = await _read(db, reader)
    assert [r.id for r in change.fresh] == ["c"]
    assert change.changed == [("a", 5, "waiting for capacity")]
    assert change.gone == ["b"]
    assert set(reader.known) == {"a", "c"} and reader.known["a"][1] == 5
    await db.dispose()


async def test_a_forgotten_job_is_read_whole_again(db_url: str) -> None:
    """A job the pass could not use (its spec unreadable: failed, maybe not committed) comes again whole."""
    db = await _db(db_url)
    reader = QueueReader()
    await _job(db, "a", 0, 100.0)
    assert [r.id for r in (await _read(db, reader)).fresh] == ["a"]
    reader.forget("a")
    again = await _read(db, reader)
    assert [r.id for r in again.fresh] == ["a"] and again.fresh[0].job_spec == {"job_num": 0}
    assert again.gone == []
    await db.dispose()


async def test_a_job_that_leaves_between_the_two_reads_is_not_known(db_url: str) -> None:
    """The state read names a new job, which leaves before its documents are read: it is not taken as
    known, so that were it back in the queue the next read would read it whole."""
    db = await _db(db_url)
    reader = QueueReader()
    await _job(db, "a", 0, 100.0)
    async with db.read() as conn:

        class LeavesMeanwhile:
            """The queue's state read on one connection, then job ``a`` stopped, then its documents read on
            another (as Postgres' read-committed statements each see what was committed before them)."""

            dialect = conn.dialect

            async def get_raw_connection(self) -> Any:  # the state's read
                return await conn.get_raw_connection()

            async def execute(self, statement: Any, *args: Any) -> Any:  # the documents' read
                await _set(db, "a", status="terminated")
                async with db.read() as later:
                    return await later.execute(statement, *args)

        change = await reader.read(LeavesMeanwhile())  # type: ignore[arg-type]
    assert change.fresh == [] and "a" not in reader.known
    await _set(db, "a", status="submitted")
    assert [r.id for r in (await _read(db, reader)).fresh] == ["a"]
    await db.dispose()


async def test_a_job_with_facts_is_read_without_its_documents(db_url: str) -> None:
    """A job written with its scheduling facts comes with them and without its documents; one written without
    them (an older corral's), or with a version this code does not read, comes with its documents instead."""
    db = await _db(db_url)
    reader = QueueReader()
    doc = orjson.loads(FACTS)
    written = (("new", FACTS), ("old", None), ("newer", orjson.dumps({**doc, "v": 99}).decode()))
    for num, (job_id, facts) in enumerate(written):
        await _job(db, job_id, num, 100.0 + num)
        await _set(db, job_id, scheduling_facts=facts, replica_num=5)
    rows = {r.id: r for r in (await _read(db, reader)).fresh}
    assert rows["new"].facts == decode(FACTS) and rows["new"].facts is not None
    assert rows["new"].job_spec is None and rows["new"].run_spec is None and rows["new"].replica_num == 5
    for num, job_id in ((1, "old"), (2, "newer")):
        assert rows[job_id].facts is None
        assert rows[job_id].job_spec == {"job_num": num} and rows[job_id].run_spec == {}
    await db.dispose()


async def _logged(db: Database) -> list[str]:
    async with db.read() as conn:
        return [r.job_id for r in await conn.execute(sa.select(queue_changes).order_by(queue_changes.c.seq))]


async def test_the_triggers_log_each_change_to_the_queue_and_nothing_else(db_url: str) -> None:
    """A job that comes, changes its priority or message while it waits, leaves (placed, stopped or deleted) is
    logged once per change; a write that changes nothing a pass reads, or a job out of the queue, is not."""
    db = await _db(db_url)
    await _job(db, "a", 0, 100.0)
    await _job(db, "b", 1, 100.0)
    await _set(db, "b", status="provisioning")  # left the queue
    assert await _logged(db) == ["a", "b", "b"]
    await _set(db, "a", status_message="waiting", priority=2)
    await _set(db, "a", status_message="waiting", log_offset=7)  # the same message, and a field a pass ignores
    await _set(db, "b", status_message="pulling", status="running")  # out of the queue throughout
    await _set(db, "b", status="submitted")  # back in the queue (a resubmission)
    async with db.write() as conn:
        await conn.execute(sa.delete(jobs).where(jobs.c.id == "b"))
    assert await _logged(db) == ["a", "b", "b", "a", "b", "b"]
    await db.dispose()


async def test_reads_from_the_log_agree_with_reads_of_the_whole_state(db_url: str) -> None:
    """After any mix of jobs coming, changing, leaving and coming back, a reader going on from its last read
    (the log, on SQLite) knows what a new reader reading the whole state knows, and each read tells the
    difference from the one before."""
    db = await _db(db_url)
    reader, rng, ids = QueueReader(), random.Random(7), [f"j{k}" for k in range(12)]
    present: set[str] = set()
    for step in range(60):
        job_id = rng.choice(ids)
        if job_id not in present:
            await _job(db, job_id, ids.index(job_id), 100.0 + step)
            present.add(job_id)
        else:
            values: dict[str, object] = rng.choice(
                [
                    {"priority": rng.randint(0, 2)},
                    {"status_message": rng.choice([None, "waiting", "no capacity"])},
                    {"status": rng.choice(["submitted", "provisioning", "terminated"])},
                    {"log_offset": step},
                ]
            )
            await _set(db, job_id, **values)
        if step % 3 == 2:
            before = dict(reader.known)
            change = await _read(db, reader)
            whole = QueueReader()
            await _read(db, whole)
            assert reader.known == whole.known, step
            assert {r.id for r in change.fresh} == whole.known.keys() - before.keys()
            assert set(change.gone) == before.keys() - whole.known.keys()
            assert {s[0] for s in change.changed} == {
                k for k in before.keys() & whole.known.keys() if before[k] != whole.known[k]
            }
    await db.dispose()


async def test_a_reader_whose_mark_a_prune_passed_reads_the_whole_state(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader prunes the log behind what it read (SQLite: up to its own last row, which stays; Postgres: up to
    its mark of the round before, leaving a marker); another reader whose mark is older reads the queue's state
    whole, missing nothing."""
    monkeypatch.setattr(queue_reader, "PRUNE_AFTER", 4)
    db = await _db(db_url)
    ahead, behind = QueueReader(), QueueReader()
    await _job(db, "a", 0, 100.0)
    await _read(db, ahead)
    await _read(db, behind)
    assert ahead.prune_due() is None
    upto = None
    for rnd in range(2):
        for k in range(1, 6):
            await _job(db, f"j{rnd}{k}", rnd * 10 + k, 100.0 + k)
        await _set(db, "a", status="terminated", priority=rnd)
        await _read(db, ahead)
        upto = ahead.prune_due() or upto
    assert upto is not None and ahead.prune_due() is None
    logged = len(await _logged(db))
    async with db.write() as conn:
        await queue_reader.prune(conn, upto)
    assert len(await _logged(db)) < logged
    await _job(db, "late", 99, 200.0)
    change = await _read(db, behind)
    assert len(change.fresh) == 11 and change.gone == ["a"]
    assert [r.id for r in (await _read(db, ahead)).fresh] == ["late"]
    assert ahead.known == behind.known
    await db.dispose()


async def test_postgres_a_change_committed_after_a_later_one_is_read() -> None:
    """Postgres: a transaction that wrote to the queue before another, and commits after a read that saw the
    other's change, is read by the next read (its log row's sequence value is below what was read)."""
    from pg_harness import new_database_url

    db = await _db(new_database_url())
    reader = QueueReader()
    await _read(db, reader)
    async with db.write() as slow:
        await slow.execute(sa.insert(jobs).values(**_job_values("slow", 0, 100.0)))
        await _job(db, "fast", 1, 101.0)
        assert [r.id for r in (await _read(db, reader)).fresh] == ["fast"]
    assert [r.id for r in (await _read(db, reader)).fresh] == ["slow"]
    assert await _read(db, reader) == QueueChange([], [], [])
    await db.dispose()
