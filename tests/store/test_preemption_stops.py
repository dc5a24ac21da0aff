"""Victims stopped by two transactions at once (two server replicas, on SQLite and Postgres): each chose a
different gang for the same waiting run; the second waits for the first to commit, then finds a gang
already stopping for that run and stops nothing, so the run has one victim, not two."""

from __future__ import annotations

import asyncio
import json
import time

import sqlalchemy as sa
from test_plan_apply import OFFER, _db

from corral.scheduler.codec import offer_to_json
from corral.scheduler.preemption import WITHIN_PROJECT, Preemption
from corral.store.db import Database
from corral.store.preemption import PREEMPTED, stop_victims
from corral.store.tables import instances, jobs, runs


async def _setup(db: Database) -> None:
    """Runs ``v0`` and ``v1`` running on instances ``i0`` and ``i1``; run ``high`` waits."""
    now = time.time()
    async with db.write() as conn:
        for n in range(2):
            await conn.execute(
                sa.insert(instances).values(
                    id=f"i{n}", project_id="p", fleet_id="f", name=f"f-{n}", instance_num=n, status="busy",
                    unreachable=False, backend="local", price=0.0, offer=json.dumps(offer_to_json(OFFER)),
                    total_blocks=1, busy_blocks=1, created_at=now, last_processed_at=now, deleted=False,
                )
            )  # fmt: skip
        for num, (run_id, status, inst) in enumerate(
            (("v0", "running", "i0"), ("v1", "running", "i1"), ("high", "submitted", None))
        ):
            await conn.execute(
                sa.insert(runs).values(
                    id=run_id, project_id="p", user_id="u", run_name=run_id, submitted_at=now,
                    last_processed_at=now, status=status, run_spec="{}", priority=0, deployment_num=0,
                    deleted=False,
                )
            )  # fmt: skip
            await conn.execute(
                sa.insert(jobs).values(
                    id=f"{run_id}-0", run_id=run_id, project_id="p", run_name=run_id, job_num=num, replica_num=0,
                    job_name=run_id, submission_num=0, deployment_num=0, submitted_at=now, last_processed_at=now,
                    status=status, job_spec="{}", priority=0, blocks=1, log_offset=0, instance_id=inst,
                )
            )  # fmt: skip


async def _until_second_waits(db: Database, second: asyncio.Task[list[Preemption]]) -> None:
    """Until the second transaction waits for the first's lock. Postgres: a lock not granted (``pg_locks``), seen
    from a third connection. SQLite takes one writer at a time (the process's write lock, then ``BEGIN
    IMMEDIATE``): the second cannot begin before the first commits, so there is nothing to wait for."""
    if db.is_sqlite:
        return
    deadline = time.monotonic() + 10
    while True:
        async with db.read() as conn:
            waiting = (await conn.execute(sa.text("SELECT count(*) FROM pg_locks WHERE NOT granted"))).scalar_one()
        if waiting:
            break
        assert not second.done(), "the second stop did not wait for the first to commit"
        assert time.monotonic() < deadline, "the second stop never waited for the first"
        await asyncio.sleep(0.02)
    assert not second.done()


def _for_high(victim: str) -> Preemption:
    return Preemption(victim, victim, (f"{victim}-0",), "high", "high", WITHIN_PROJECT)


async def _stop(db: Database, p: Preemption) -> list[Preemption]:
    async with db.write() as conn:
        return await stop_victims(conn, [p], time.time())


async def test_two_stops_for_one_preemptor_at_once_stop_one_gang(db_url: str) -> None:
    db = await _db(db_url)
    try:
        await _setup(db)
        async with db.write() as conn:
            first = await stop_victims(conn, [_for_high("v0")], time.time())
            second = asyncio.create_task(_stop(db, _for_high("v1")))
            await _until_second_waits(db, second)
        assert first == [_for_high("v0")]
        assert await asyncio.wait_for(second, 10) == []
        async with db.read() as conn:
            stopped = (await conn.execute(sa.select(jobs.c.id).where(jobs.c.stop_requested == PREEMPTED))).all()
        assert [r.id for r in stopped] == ["v0-0"]
    finally:
        await db.dispose()
