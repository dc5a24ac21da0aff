"""An instance's busy blocks, written from a count of its unfinished jobs, never miss a job's end that commits
meanwhile (SQLite and Postgres). On Postgres a transaction could count the blocks, wait for the instance's row while
another transaction ended the job and released it, then write its stale count: the instance stayed ``busy`` with
no job on it, its blocks lost for good (a waiting run then never started). Each writer now locks the instance's row
before it counts."""

from __future__ import annotations

import asyncio
import json
import time

import sqlalchemy as sa
from test_plan_apply import OFFER, _db

from corral.scheduler.codec import offer_to_json
from corral.store.db import Connection, Database
from corral.store.events import tracked_update
from corral.store.fleets import release_instance
from corral.store.instance_outcomes import ProvisionedInstance, record_provisioned
from corral.store.tables import instances, jobs, runs

TOKEN = "lease-token"


async def _instance_with_a_job(db: Database, status: str, job_statuses: list[str]) -> None:
    now = time.time()
    async with db.write() as conn:
        await conn.execute(
            sa.insert(instances).values(
                id="i", project_id="p", fleet_id="f", name="f-0", instance_num=0, status=status,
                unreachable=False, backend="local", price=0.0, offer=json.dumps(offer_to_json(OFFER)),
                total_blocks=2, busy_blocks=len(job_statuses), created_at=now, last_processed_at=now, deleted=False,
                lock_owner="worker", lock_token=TOKEN, lock_expires_at=now + 60,
            )
        )  # fmt: skip
        await conn.execute(
            sa.insert(runs).values(
                id="race", project_id="p", user_id="u", run_name="race", submitted_at=now, last_processed_at=now,
                status="provisioning", run_spec="{}", priority=0, deployment_num=0, deleted=False,
            )
        )  # fmt: skip
        for num, job_status in enumerate(job_statuses):
            await conn.execute(
                sa.insert(jobs).values(
                    id=f"j{num}", run_id="race", project_id="p", run_name="race", job_num=num, replica_num=0,
                    job_name=f"j{num}", submission_num=0, deployment_num=0, submitted_at=now, last_processed_at=now,
                    status=job_status, job_spec="{}", priority=0, blocks=1, log_offset=0, instance_id="i",
                )
            )  # fmt: skip


async def _end_job(conn: Connection, job_id: str) -> None:
    await tracked_update(conn, jobs, jobs.c.id == job_id, {"status": "terminated", "finished_at": time.time()})


async def _waiting_on_a_lock(db: Database) -> bool:
    """Whether some transaction waits for a row lock (Postgres). SQLite takes one writer at a time (the process's
    write lock, then ``BEGIN IMMEDIATE``): the second cannot begin before the first commits, nothing to wait for."""
    if db.is_sqlite:
        return True
    async with db.read() as conn:
        waiting = (await conn.execute(sa.text("SELECT count(*) FROM pg_locks WHERE NOT granted"))).scalar_one()
    return bool(waiting)


async def _until_waiting(db: Database) -> None:
    deadline = time.monotonic() + 10
    while not await _waiting_on_a_lock(db):
        assert time.monotonic() < deadline, "the second transaction never waited"
        await asyncio.sleep(0.02)


async def _instance(db: Database) -> tuple[str, int]:
    async with db.read() as conn:
        row = (await conn.execute(sa.select(instances.c.status, instances.c.busy_blocks))).one()
    return row.status, row.busy_blocks


async def test_a_job_ended_while_its_instance_comes_up_leaves_the_instance_idle(db_url: str) -> None:
    db = await _db(db_url)
    try:
        await _instance_with_a_job(db, "pending", ["provisioning"])
        found = ProvisionedInstance({"url": "http://127.0.0.1:1"}, "127.0.0.1", offer_to_json(OFFER), 2, "local", 0.0)

        async def provisioned() -> bool:
            async with db.write() as conn:
                return await record_provisioned(conn, "i", TOKEN, found, time.time())

        async with db.write() as conn:  # the job is stopped while its instance is still coming up
            await _end_job(conn, "j0")
            await release_instance(conn, "i", time.time())
            recording = asyncio.create_task(provisioned())
            await _until_waiting(db)
        assert await asyncio.wait_for(recording, 10)
        assert await _instance(db) == ("idle", 0)
    finally:
        await db.dispose()


async def test_two_jobs_ending_at_once_leave_their_instance_idle(db_url: str) -> None:
    db = await _db(db_url)
    try:
        await _instance_with_a_job(db, "busy", ["running", "running"])

        async def end_second() -> None:
            async with db.write() as conn:
                await _end_job(conn, "j1")
                await release_instance(conn, "i", time.time())

        async with db.write() as conn:  # the first end counts the other job still running, and writes 1
            await _end_job(conn, "j0")
            await release_instance(conn, "i", time.time())
            second = asyncio.create_task(end_second())  # the second end, meanwhile
            await _until_waiting(db)
        await asyncio.wait_for(second, 10)
        assert await _instance(db) == ("idle", 0)
    finally:
        await db.dispose()
