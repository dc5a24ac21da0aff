"""The queue as a scheduling pass reads it: each read tells the jobs that came (read whole, once), the ones
whose priority or status message changed, and the ones that left; on SQLite and Postgres."""

from __future__ import annotations

import time
from typing import Any

import orjson
import sqlalchemy as sa

from corral.domain.job_facts import JobFacts, WaitRule, decode, encode
from corral.domain.resources import Requirements
from corral.store.db import Database
from corral.store.migrate import upgrade
from corral.store.queue_reader import QueueChange, QueueReader
from corral.store.tables import jobs
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


async def _job(db: Database, job_id: str, job_num: int, submitted_at: float) -> None:
    async with db.write() as conn:
        await conn.execute(
            sa.insert(jobs).values(
                id=job_id, run_id="r", project_id="p", run_name="r", job_num=job_num, replica_num=0,
                job_name=job_id, submission_num=0, deployment_num=0, submitted_at=submitted_at,
                last_processed_at=submitted_at, status="submitted", job_spec=f'{{"job_num": {job_num}}}',
                priority=0, blocks=1, log_offset=0,
            )
        )  # fmt: skip


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
