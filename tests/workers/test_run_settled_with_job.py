"""A run of one job settled in the transaction that changes its job: the job's start and end write the run's status
themselves, as the runs worker would (its own decision, ``decide_one``), with the same events in the same order
and the kept run counts moved alike, and the runs worker is not woken for it. A run whose job asks for a retry, and
a run a user is stopping, are left to the runs worker. On Postgres a job's end never waits for its run's row (a
user's stop holds it, and then asks for the job's): it leaves the run to the runs worker. Real SQLite and
Postgres."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
import sqlalchemy as sa

from corral.agent.protocol import JobState
from corral.context import Context
from corral.domain.records import JobRec
from corral.settings import Settings
from corral.store import run_counts
from corral.store import runs as run_store
from corral.store.db import Database
from corral.store.migrate import upgrade
from corral.store.run_states import JobState as RunJobState
from corral.store.run_states import RunState
from corral.store.tables import event_targets, events, instances, jobs, runs
from corral.workers.jobs.outcomes import JobOutcomes, Tail
from corral.workers.run_settle import settles_alone
from corral.workers.runs import Runs
from store_rows import a_run, admin_and_project

TOKEN = "follower-lease"
#: A task whose failed job is submitted again (``retry.on_events: [error]``, dstack's names).
RETRIED = {"retry": {"on_events": ["error"], "duration": 3600}}


async def _seed(db: Database, run_status: str, job_status: str, job_spec: Mapping[str, object] | None = None) -> None:
    """Run ``r`` (one job, ``j``, on host ``i`` of an SSH fleet), counted in the kept run counts."""
    now = time.time()
    async with db.write() as conn:
        await admin_and_project(conn, now)
        await conn.execute(
            sa.insert(instances).values(
                id="i", project_id="p", fleet_id=None, name="host-0", instance_num=0, status="busy",
                unreachable=False, backend="ssh", price=0.0, total_blocks=1, busy_blocks=1, created_at=now,
                last_processed_at=now, deleted=False,
            )
        )  # fmt: skip
        await a_run(conn, "r", now, status=run_status, name="one-job")
        await conn.execute(
            sa.insert(jobs).values(
                id="j", run_id="r", project_id="p", run_name="one-job", job_num=0, replica_num=0,
                job_name="one-job-0-0", submission_num=0, deployment_num=0, submitted_at=now, last_processed_at=now,
                status=job_status, job_spec=json.dumps(job_spec or {}), priority=0, blocks=1, log_offset=0,
                instance_id="i", lock_owner="replica", lock_token=TOKEN, lock_expires_at=now + 300,
            )
        )  # fmt: skip
        await run_counts.recount(conn)


def _outcomes(db: Database, tmp_path: Path) -> JobOutcomes:
    return JobOutcomes(Context(Settings(server_dir=tmp_path, database_url=db.url), db, {}))


async def _job(db: Database) -> JobRec:
    async with db.read() as conn:
        job = await run_store.get_job(conn, "j")
    assert job is not None
    return job


async def _run_status(db: Database) -> tuple[str, str | None]:
    async with db.read() as conn:
        row = (await conn.execute(sa.select(runs.c.status, runs.c.termination_reason))).one()
    return row.status, row.termination_reason


async def _messages(db: Database) -> list[tuple[str, str]]:
    """Every event as (its target's type, its message), in the order they were recorded."""
    q = (
        sa.select(event_targets.c.entity_type, events.c.message)
        .join(events, events.c.id == event_targets.c.event_id)
        .order_by(events.c.recorded_at)
    )
    async with db.read() as conn:
        return [(r[0], r[1]) for r in await conn.execute(q)]


async def _counts_agree(db: Database) -> bool:
    async with db.read() as conn:
        kept = {(s, n) for (_, _), by in (await run_counts.by_status(conn)).items() for s, n in by.items()}
        recount = {
            (r[0], int(r[1]))
            for r in await conn.execute(sa.select(runs.c.status, sa.func.count()).group_by(runs.c.status))
        }
    return kept == recount


async def test_a_job_that_starts_and_ends_settles_its_run_in_the_same_transactions(
    db: Database, tmp_path: Path
) -> None:
    await _seed(db, "provisioning", "pulling")
    outcomes = _outcomes(db, tmp_path)
    woken = outcomes.ctx.wakeups.event("runs")
    await outcomes.pulling(await _job(db), JobState("j", "running"))
    assert await _run_status(db) == ("running", None)
    await outcomes.finish(await _job(db), JobState("j", "done", exit_status=0), None, tail=Tail(TOKEN, [], 0))
    assert await _run_status(db) == ("done", "all_jobs_done")
    assert not woken.is_set(), "the runs worker has nothing left to do for the run"
    assert await _messages(db) == [
        ("job", "Job status changed PULLING -> RUNNING"),
        ("run", "Run status changed PROVISIONING -> RUNNING"),
        ("job", "Job status changed RUNNING -> DONE. Termination reason: DONE_BY_RUNNER"),
        ("instance", "Instance status changed BUSY -> IDLE"),
        ("run", "Run status changed RUNNING -> DONE. Termination reason: ALL_JOBS_DONE"),
    ]
    assert await _counts_agree(db)
    await Runs(outcomes.ctx).pass_once()  # a whole pass of the runs worker finds nothing more to do
    assert len(await _messages(db)) == 5


async def test_a_failed_job_with_no_retry_fails_its_run_with_it(db: Database, tmp_path: Path) -> None:
    await _seed(db, "running", "running")
    outcomes = _outcomes(db, tmp_path)
    await outcomes.finish(await _job(db), JobState("j", "failed", exit_status=3), None)
    assert await _run_status(db) == ("failed", "job_failed")
    assert not outcomes.ctx.wakeups.event("runs").is_set()
    assert (await _messages(db))[-1] == ("run", "Run status changed RUNNING -> FAILED. Termination reason: JOB_FAILED")
    assert await _counts_agree(db)


async def test_a_failed_job_to_retry_is_left_to_the_runs_worker(db: Database, tmp_path: Path) -> None:
    await _seed(db, "running", "running", RETRIED)
    outcomes = _outcomes(db, tmp_path)
    await outcomes.finish(await _job(db), JobState("j", "failed", exit_status=3), None)
    assert await _run_status(db) == ("running", None), "the job's end decides nothing of a retry"
    assert outcomes.ctx.wakeups.event("runs").is_set(), "the runs worker is woken to decide"
    await Runs(outcomes.ctx).pass_once()
    async with db.read() as conn:
        submissions = sorted((r.submission_num, r.status) for r in await conn.execute(sa.select(jobs)))
    assert submissions == [(0, "failed"), (1, "submitted")], "the runs worker submitted the job again"


async def test_a_run_being_stopped_is_left_to_the_runs_worker(db: Database, tmp_path: Path) -> None:
    await _seed(db, "terminating", "terminating")
    outcomes = _outcomes(db, tmp_path)
    await outcomes.finish(await _job(db), JobState("j", "terminated"), "stop")
    assert await _run_status(db) == ("terminating", None)
    assert outcomes.ctx.wakeups.event("runs").is_set()


def test_a_job_that_ends_while_its_run_is_being_stopped_does_not_wait_for_the_stop_on_postgres(
    tmp_path: Path,
) -> None:
    from pg_harness import new_database_url

    async def run() -> None:
        db = Database(new_database_url())
        await upgrade(db)
        await _seed(db, "running", "running")
        outcomes = _outcomes(db, tmp_path)
        job = await _job(db)
        try:
            # a user's stop as ``services/runs.py`` writes it: the run's row, then its job's
            async with db.write() as stop:
                await run_store.update_run(
                    stop, "r", {"status": "terminating", "termination_reason": "stopped_by_user"}, ("running",)
                )
                end = outcomes.finish(job, JobState("j", "done", exit_status=0), None, tail=Tail(TOKEN, [], 0))
                assert await asyncio.wait_for(end, timeout=10), "the job's end does not wait for the run's row"
                await run_store.update_job(stop, "j", {"stop_requested": "stop"})
            assert await _run_status(db) == ("terminating", "stopped_by_user")
            assert (await _job(db)).status == "done"
            assert outcomes.ctx.wakeups.event("runs").is_set(), "the run is left to the runs worker"
            await Runs(outcomes.ctx).pass_once()
            assert await _run_status(db) == ("terminated", "stopped_by_user")
            assert await _counts_agree(db)
        finally:
            await db.dispose()

    asyncio.run(run())


def _state(
    run_status: str = "running", jobs: int = 1, schedule: tuple[str, ...] | None = None, **job: bool
) -> RunState:
    """A run of ``jobs`` jobs of one replica, each running (``job``: the jobs' flags: ``ready``, ``preempted``)."""
    states = tuple(
        RunJobState(0, n, 0, "running", None, None, f"j{n}", None, True, 0.0, None, **job) for n in range(jobs)
    )
    return RunState("r", run_status, None, None, states, schedule=schedule)


@pytest.mark.parametrize(
    ("state", "alone"),
    [
        (_state(), True),
        (_state("submitted"), True),
        (_state(jobs=2), False),  # a multi-node run
        (_state("terminating"), False),  # a stop
        (_state("pending"), False),
        (_state(schedule=("0 * * * *",)), False),
        (_state(ready=True), False),  # a service replica
        (_state(preempted=True), False),
    ],
)
def test_only_a_run_of_one_job_not_stopping_scheduled_nor_a_service_settles_with_its_job(
    state: RunState, alone: bool
) -> None:
    assert settles_alone(state) is alone
