"""Job starts batched per pass (one transaction claims every job a pass starts), and jobs a replica's scheduler
placed and leased in its commit handed straight to that replica's jobs worker: under any interleaving of two
server replicas' placements, passes, stale reads and the jobs' progress, no job is handed to an agent twice,
and every job is handed to one.

The jobs worker's passes run for real on a real SQLite database; only the submission to the agent is
replaced (it records the start, then moves the job on as the real one does: ``running`` guarded by its
status, followed while this replica holds the lease, released once it ends).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from corral.context import Context
from corral.domain.records import InstanceRec, JobRec, RunRec
from corral.scheduler.types import Assign, Gang, Plan
from corral.settings import Settings
from corral.store import runs as run_store
from corral.store.db import Database
from corral.store.migrate import upgrade
from corral.store.plan_apply import apply_plan
from corral.store.plan_result import JobLease
from corral.store.tables import fleets, instances, jobs, runs
from corral.workers.jobs.driver import Jobs
from corral.workers.jobs.follower import Started
from store_rows import admin_and_project

N_JOBS = 4
#: The jobs placed before the test starts (claimed by a jobs pass); the others wait to be placed by a replica's
#: scheduler, which leases them in the same commit.
N_PLACED = 2


async def _seed(db: Database) -> None:
    now = time.time()
    async with db.write() as conn:
        await admin_and_project(conn, now)
        spec = {"configuration": {"type": "fleet", "name": "f", "nodes": 1}}
        await conn.execute(
            sa.insert(fleets).values(
                id="f", project_id="p", name="f", created_at=now, last_processed_at=now, status="active",
                spec=json.dumps(spec), deleted=False,
            )
        )  # fmt: skip
        await conn.execute(
            sa.insert(instances).values(
                id="i", project_id="p", fleet_id="f", name="f-0", instance_num=0, status="busy", unreachable=False,
                backend="local", total_blocks=N_JOBS, busy_blocks=N_JOBS, created_at=now, last_processed_at=now,
                deleted=False, agent=json.dumps({"url": "http://127.0.0.1:9", "token": "x"}),
            )
        )  # fmt: skip
        await conn.execute(
            sa.insert(runs).values(
                id="r", project_id="p", user_id="u", run_name="r", submitted_at=now, last_processed_at=now,
                status="provisioning", run_spec="{}", priority=0, deployment_num=0, deleted=False,
            )
        )  # fmt: skip


async def _reset(db: Database) -> None:
    now = time.time()
    async with db.write() as conn:
        await conn.execute(sa.delete(jobs))
        for n in range(N_JOBS):
            await conn.execute(
                sa.insert(jobs).values(
                    id=f"j{n}", run_id="r", project_id="p", run_name="r", job_num=n, replica_num=0, job_name=f"r-{n}",
                    submission_num=0, deployment_num=0, submitted_at=now, last_processed_at=now,
                    status="provisioning" if n < N_PLACED else "submitted", job_spec="{}", priority=0, blocks=1,
                    log_offset=0, instance_id="i" if n < N_PLACED else None,
                )
            )  # fmt: skip


async def _place(ctx: Context) -> None:
    """This replica's scheduler places the first job still waiting, leased to it in the same commit, and hands
    it to its jobs worker as ``workers/scheduling.py`` does."""
    async with ctx.db.read() as conn:
        waiting = (
            await conn.execute(sa.select(jobs.c.id).where(jobs.c.status == "submitted").order_by(jobs.c.id))
        ).first()
    if waiting is None:
        return
    now = time.time()
    lease = JobLease(ctx.replica_id, ctx.settings.job_lease_ttl)
    plan = Plan((Gang("r", (Assign(waiting.id, "i", 1),), "p"),))
    result = await apply_plan(ctx.db, plan, now, lease=lease)
    ctx.hand_over(result.leased, now + lease.ttl)


class Replica:
    """One server replica's jobs worker whose agent submissions and followers are driven by the test, one
    step at a time (each waits at a gate the test opens)."""

    def __init__(self, ctx: Context, started: list[str]) -> None:
        self.jobs = Jobs(ctx)
        self.started = started
        self.gates: list[asyncio.Event] = []
        self.moved = asyncio.Event()
        self.loaded: tuple[list[JobRec], dict[str, InstanceRec], set[str], dict[str, RunRec]] | None = None
        self.jobs.submissions.submit_once = self._submit_once  # type: ignore[method-assign]
        self.jobs.followers.follow = self._follow  # type: ignore[method-assign]

    async def _gate(self) -> None:
        go = asyncio.Event()
        self.gates.append(go)
        self.moved.set()
        await go.wait()

    async def _submit_once(self, job: JobRec, inst: InstanceRec, run: RunRec | None = None) -> None:
        """The agent is handed the job; once it answers, the job is ``running`` (guarded by its status, as the
        real submission records it) and followed; the submission's task ends there, as the real one does."""
        try:
            self.started.append(job.id)
            await self._gate()
            async with self.jobs.ctx.db.write() as conn:
                ok = await run_store.update_job(conn, job.id, {"status": "running"}, expect_status=("provisioning",))
            if ok:
                self.jobs.followers.follow(job, inst)
            else:
                await self.jobs.leases.release(job.id)
        finally:
            self.moved.set()

    def _follow(
        self, job: JobRec, inst: InstanceRec, conf: dict[str, Any] | None = None, started: Started | None = None
    ) -> None:
        task = asyncio.create_task(self._follower(job))
        self.jobs.followers.tasks[job.id] = task
        task.add_done_callback(lambda _t: self.jobs.followers.tasks.pop(job.id, None))

    async def _follower(self, job: JobRec) -> None:
        """The job runs until the test lets it end; then it is ``done`` and the lease is let go."""
        try:
            await self._gate()
            async with self.jobs.ctx.db.write() as conn:
                await run_store.update_job(conn, job.id, {"status": "done"}, expect_status=("running",))
            await self.jobs.leases.release(job.id)
        finally:
            self.moved.set()

    async def step(self) -> None:
        """Let the oldest task waiting at a gate take its next step (until it waits again or ends)."""
        if not self.gates:
            return
        self.moved.clear()
        self.gates.pop(0).set()
        await self.moved.wait()
        await asyncio.sleep(0)  # done callbacks


OPS = st.lists(
    st.tuples(st.sampled_from(("load", "act", "step", "step", "pass", "place")), st.integers(0, 1)), max_size=30
)


@st.composite
def interleavings(draw: st.DrawFn) -> list[tuple[str, int]]:
    return draw(OPS)


@pytest.fixture(scope="module")
def db_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('starts') / 'c.db'}"

    async def prepare() -> None:
        db = Database(url)
        await upgrade(db)
        await _seed(db)
        await db.dispose()

    asyncio.run(prepare())
    return url


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=interleavings())
# the race a pass's stale read opens: the job it read as placed is running by the time it acts, its start's
# task over and its follower holding the lease
@example(ops=[("pass", 0), ("load", 0), ("step", 0), ("act", 0)])
# a whole pass of the other replica reads a job placed and leased here before this replica's jobs worker starts it
@example(ops=[("place", 0), ("load", 1), ("pass", 0), ("act", 1), ("step", 0)])
# a stale read of this replica's own pass, acted on after the handed-over job started
@example(ops=[("load", 0), ("place", 0), ("pass", 0), ("step", 0), ("act", 0)])
def test_no_job_is_started_twice_under_batched_claims(db_url: str, ops: list[tuple[str, int]]) -> None:
    asyncio.run(_run(Database(db_url), ops))


async def _run(db: Database, ops: list[tuple[str, int]]) -> None:
    await _reset(db)
    started: list[str] = []
    conf = Settings(server_dir=Path("/nonexistent"), database_url=db.url, job_lease_ttl=300.0)
    replicas = [Replica(Context(conf, db, {}, replica_id=f"replica-{n}"), started) for n in range(2)]
    try:
        for op, n in ops:
            r = replicas[n]
            if op == "load":  # a pass reads the jobs ...
                r.loaded = await r.jobs._load()
            elif op == "act" and r.loaded is not None:  # ... and acts later, on what may be stale by then
                await r.jobs._act(*r.loaded)
                r.loaded = None
            elif op == "pass":
                await r.jobs.pass_once()
            elif op == "place":
                await _place(r.jobs.ctx)
            elif op == "step":
                await r.step()
            await asyncio.sleep(0)
            assert len(started) == len(set(started)), f"a job was started twice: {started}"
        for _ in range(3 * N_JOBS):  # the rest: every job still gets placed and started once
            for r in replicas:
                await _place(r.jobs.ctx)
                await r.jobs.pass_once()
                await asyncio.sleep(0)
                while r.gates:
                    await r.step()
                    await asyncio.sleep(0)
        assert sorted(started) == [f"j{n}" for n in range(N_JOBS)]
    finally:
        for r in replicas:
            for gate in r.gates:
                gate.set()
        await asyncio.sleep(0)
        await db.dispose()


def test_a_stopping_server_lets_go_of_the_jobs_its_scheduler_leased_but_did_not_start(db_url: str) -> None:
    """A job placed and leased by this replica's scheduler, not yet started when the server stops: its lease is
    released, so the next server (or another replica) starts it at once rather than after the lease's expiry."""

    async def run() -> None:
        db = Database(db_url)
        await _reset(db)
        conf = Settings(server_dir=Path("/nonexistent"), database_url=db.url, job_lease_ttl=300.0)
        ctx = Context(conf, db, {}, replica_id="replica-0")
        jobs_worker = Jobs(ctx)
        await _place(ctx)
        assert ctx.placed_leases, "the placement was leased to this replica"
        await jobs_worker.stop_all()
        async with db.read() as conn:
            q = sa.select(jobs.c.id, jobs.c.lock_owner).where(jobs.c.status == "provisioning")
            owners = {r.id: r.lock_owner for r in await conn.execute(q)}
        assert owners and all(owner is None for owner in owners.values()), owners
        await db.dispose()

    asyncio.run(run())
