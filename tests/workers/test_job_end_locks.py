"""Two jobs ending at once on one host never deadlock on Postgres (the real cluster the tests start).

A job's end with its last output writes the job's row twice (the log offset, then its end), and Postgres checks
the second write's foreign keys (the row it updates was written by the same transaction), taking a key-share lock
on the instance's row. Its instance's release then asks for that row ``FOR UPDATE``: two ends on one host each held
the share lock and waited for the other's to go, and Postgres broke the cycle by failing one
(``deadlock detected``). Each end now locks the instance's row before it writes anything, as the commit point does.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import sqlalchemy as sa

from corral.agent.protocol import JobState
from corral.context import Context
from corral.settings import Settings
from corral.store import runs as run_store
from corral.store.db import Database
from corral.store.migrate import upgrade
from corral.store.tables import instances, jobs
from corral.workers.jobs.outcomes import JobOutcomes, Tail
from store_rows import a_run, admin_and_project

TOKEN = "follower-lease"


async def _two_running_jobs_on_one_host(db: Database) -> None:
    now = time.time()
    async with db.write() as conn:
        await admin_and_project(conn, now)
        await conn.execute(
            sa.insert(instances).values(
                id="i", project_id="p", fleet_id=None, name="host-0", instance_num=0, status="busy",
                unreachable=False, backend="ssh", price=0.0, total_blocks=2, busy_blocks=2, created_at=now,
                last_processed_at=now, deleted=False,
            )
        )  # fmt: skip
        for n in range(2):
            await a_run(conn, f"r{n}", now, status="running")
            await conn.execute(
                sa.insert(jobs).values(
                    id=f"j{n}", run_id=f"r{n}", project_id="p", run_name=f"r{n}", job_num=0, replica_num=0,
                    job_name=f"r{n}-0", submission_num=0, deployment_num=0, submitted_at=now, last_processed_at=now,
                    status="running", job_spec="{}", priority=0, blocks=1, log_offset=0, instance_id="i",
                    lock_owner="replica", lock_token=TOKEN, lock_expires_at=now + 300,
                )
            )  # fmt: skip


async def _until_both_wait(db: Database) -> None:
    """Until the two ends wait for a row lock the host's own write holds."""
    deadline = time.monotonic() + 20
    while True:
        async with db.read() as conn:
            waiting = (await conn.execute(sa.text("SELECT count(*) FROM pg_locks WHERE NOT granted"))).scalar_one()
        if waiting >= 2:
            return
        assert time.monotonic() < deadline, f"the two ends did not both wait ({waiting} waiting)"
        await asyncio.sleep(0.05)


def test_two_jobs_ending_at_once_on_one_host_both_end_and_leave_it_idle(tmp_path: Path) -> None:
    from pg_harness import new_database_url

    async def run() -> None:
        db = Database(new_database_url())
        await upgrade(db)
        await _two_running_jobs_on_one_host(db)
        outcomes = JobOutcomes(Context(Settings(server_dir=tmp_path, database_url=db.url), db, {}))
        async with db.read() as conn:
            ended = [await run_store.get_job(conn, f"j{n}") for n in range(2)]
        try:
            # the host's own write (its health check's) holds the instance's row while both jobs end, so that
            # both ends are inside their transactions at once, whatever the loop's timing
            async with db.write() as host:
                await host.execute(sa.update(instances).where(instances.c.id == "i").values(unreachable=False))
                ends = [
                    asyncio.create_task(
                        outcomes.finish(job, JobState(job.id, "done", exit_status=0), None, tail=Tail(TOKEN, [], 0))
                    )
                    for job in ended
                    if job is not None
                ]
                await _until_both_wait(db)
            assert await asyncio.gather(*ends) == [True, True]
            async with db.read() as conn:
                statuses = {r.id: r.status for r in await conn.execute(sa.select(jobs.c.id, jobs.c.status))}
                host_row = (await conn.execute(sa.select(instances.c.status, instances.c.busy_blocks))).one()
            assert statuses == {"j0": "done", "j1": "done"}
            assert (host_row.status, host_row.busy_blocks) == ("idle", 0)
        finally:
            await db.dispose()

    asyncio.run(run())
