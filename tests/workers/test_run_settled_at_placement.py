"""A run of one job settled in the commit that places its job: the commit point (``apply_plan``, given the runs
worker's settlement as the scheduling worker gives it) moves the run ``submitted -> provisioning`` in its own
transaction, its event after the job's and the kept run counts moved alike, so that no runs pass is needed. A gang
the commit rejects settles nothing; a run of several jobs and a service are left to the runs worker, as is (on
Postgres) a run whose row another transaction holds: the commit does not wait for it. Real SQLite and Postgres,
and a real server, whose scheduling worker gives the commit point the settlement."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from corral.context import Context
from corral.domain.resources import InstanceResources
from corral.scheduler.types import Assign, Gang, Offer, Plan, Reserve
from corral.settings import Settings
from corral.store import run_counts
from corral.store import runs as run_store
from corral.store.db import Database
from corral.store.migrate import upgrade
from corral.store.plan_apply import apply_plan
from corral.store.tables import event_targets, events, fleets, instances, jobs, runs
from corral.workers.run_settle import settle_placed
from corral.workers.runs import Runs
from server_harness import finished_run, fleet_body, make_settings, running_server, task_body, wait_for
from store_rows import a_run, admin_and_project

OFFER = Offer("local", "local", "local", 0.0, InstanceResources(cpus=4, memory_mib=8192, disk_size_mib=100_000))


async def _seed(db: Database, jobs_: int = 1, ready: bool | None = None, blocks: int = 4) -> None:
    """Run ``r`` (``submitted``, ``jobs_`` waiting jobs ``j0``, ``j1``, ...; ``ready``: a service's replicas'),
    fleet ``f`` with its idle host ``i`` (``blocks`` blocks), counted in the kept run counts."""
    now = time.time()
    async with db.write() as conn:
        await admin_and_project(conn, now)
        spec = json.dumps({"configuration": {"type": "fleet", "name": "f", "nodes": {"min": 0, "max": 3}}})
        await conn.execute(
            sa.insert(fleets).values(
                id="f", project_id="p", name="f", created_at=now, last_processed_at=now, status="active", spec=spec,
                deleted=False,
            )
        )  # fmt: skip
        await conn.execute(
            sa.insert(instances).values(
                id="i", project_id="p", fleet_id="f", name="f-0", instance_num=0, status="idle", unreachable=False,
                backend="local", price=0.0, total_blocks=blocks, busy_blocks=0, created_at=now,
                last_processed_at=now, deleted=False,
            )
        )  # fmt: skip
        await a_run(conn, "r", now, name="one-job")
        for n in range(jobs_):
            await conn.execute(
                sa.insert(jobs).values(
                    id=f"j{n}", run_id="r", project_id="p", run_name="one-job", job_num=n, replica_num=0,
                    job_name=f"one-job-0-{n}", submission_num=0, deployment_num=0, submitted_at=now,
                    last_processed_at=now, status="submitted", job_spec="{}", priority=0, blocks=1, log_offset=0,
                    ready=ready,
                )
            )  # fmt: skip
        await run_counts.recount(conn)


async def _run_status(db: Database) -> str:
    async with db.read() as conn:
        return str((await conn.execute(sa.select(runs.c.status).where(runs.c.id == "r"))).scalar_one())


async def _messages(db: Database) -> list[tuple[str, str]]:
    """Every event as (its target's type, its message), in the order they were recorded."""
    q = (
        sa.select(event_targets.c.entity_type, events.c.message)
        .join(events, events.c.id == event_targets.c.event_id)
        .order_by(events.c.recorded_at, event_targets.c.entity_type)
    )
    async with db.read() as conn:
        return [(r[0], r[1]) for r in await conn.execute(q)]


async def _counts_agree(db: Database) -> bool:
    async with db.read() as conn:
        kept = {(s, n) for (_, _), by in (await run_counts.by_status(conn)).items() for s, n in by.items() if n}
        recount = {
            (r[0], int(r[1]))
            for r in await conn.execute(sa.select(runs.c.status, sa.func.count()).group_by(runs.c.status))
        }
    return kept == recount


def _runs(db: Database, tmp_path: Path) -> Runs:
    return Runs(Context(Settings(server_dir=tmp_path, database_url=db.url), db, {}))


def _on_host(*job_ids: str) -> Plan:
    return Plan((Gang("r", tuple(Assign(j, "i", 1) for j in job_ids), "p"),))


@pytest.mark.parametrize("where", ["an instance", "a new instance"])
async def test_a_placed_job_moves_its_run_to_provisioning_in_the_commit(
    db: Database, tmp_path: Path, where: str
) -> None:
    await _seed(db)
    plan = _on_host("j0") if where == "an instance" else Plan((Gang("r", (Reserve("f", OFFER, 1, 1, "j0"),), "p"),))
    result = await apply_plan(db, plan, time.time(), settle=settle_placed)
    assert result.assigned == ["j0"] and result.settled_runs == {"r"}
    assert await _run_status(db) == "provisioning", "no runs pass: the commit settled the run"
    messages = await _messages(db)
    job_placed = messages.index(("job", "Job status changed SUBMITTED -> PROVISIONING"))
    assert messages.index(("run", "Run status changed SUBMITTED -> PROVISIONING")) > job_placed
    assert await _counts_agree(db)
    await _runs(db, tmp_path).pass_once()  # a whole pass of the runs worker finds nothing more to do
    assert await _messages(db) == messages


async def test_a_gang_the_commit_rejects_settles_nothing(db: Database) -> None:
    await _seed(db, blocks=1)
    async with db.write() as conn:  # the host's only block taken meanwhile
        await conn.execute(sa.update(instances).values(status="busy", busy_blocks=1))
        await a_run(conn, "other", time.time())
        await conn.execute(
            sa.insert(jobs).values(
                id="other-0", run_id="other", project_id="p", run_name="other", job_num=0, replica_num=0,
                job_name="other-0-0", submission_num=0, deployment_num=0, submitted_at=time.time(),
                last_processed_at=time.time(), status="running", job_spec="{}", priority=0, blocks=1, log_offset=0,
                instance_id="i",
            )
        )  # fmt: skip
    result = await apply_plan(db, _on_host("j0"), time.time(), settle=settle_placed)
    assert result.rejected_runs == ["r"] and not result.settled_runs
    assert await _run_status(db) == "submitted"
    assert not any(kind == "run" for kind, _ in await _messages(db))


@pytest.mark.parametrize("kind", ["a run of two jobs", "a service"])
async def test_runs_the_settlement_declines_are_left_to_the_runs_worker(
    db: Database, tmp_path: Path, kind: str
) -> None:
    if kind == "a service":
        await _seed(db, ready=False)
        plan = _on_host("j0")
    else:
        await _seed(db, jobs_=2)
        plan = _on_host("j0", "j1")
    result = await apply_plan(db, plan, time.time(), settle=settle_placed)
    assert result.assigned and not result.settled_runs
    assert await _run_status(db) == "submitted", "left to the runs worker"
    await _runs(db, tmp_path).pass_once()
    assert await _run_status(db) == "provisioning"
    assert await _counts_agree(db)


def test_a_run_whose_row_another_transaction_holds_is_left_to_the_runs_worker_on_postgres(tmp_path: Path) -> None:
    from pg_harness import new_database_url

    async def run() -> None:
        db = Database(new_database_url())
        await upgrade(db)
        await _seed(db)
        try:
            async with db.write() as holder:  # another transaction holds the run's row (a user's stop, a pass)
                await run_store.update_run(holder, "r", {"last_processed_at": time.time()})
                commit = apply_plan(db, _on_host("j0"), time.time(), settle=settle_placed)
                result = await asyncio.wait_for(commit, timeout=10)
                assert result.assigned == ["j0"] and not result.settled_runs, "the commit did not wait for the row"
            assert await _run_status(db) == "submitted"
            await _runs(db, tmp_path).pass_once()
            assert await _run_status(db) == "provisioning"
            assert await _counts_agree(db)
        finally:
            await db.dispose()

    asyncio.run(run())


async def test_a_server_runs_a_task_of_one_job_without_waking_the_runs_worker(tmp_path: Path) -> None:
    """The scheduling worker gives the commit point the settlement: the task's placement, start and end each settle
    its run in their own transaction, so nothing wakes the runs worker for it."""
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes=1))

        async def idle() -> bool:
            return any(i["status"] == "idle" for i in (await c.post("/api/instances/list", json={})).json())

        await wait_for(idle)
        heard: list[str] = []
        s.ctx.wakeups.listen("runs", lambda: heard.append("runs"))
        await c.post("/api/project/main/runs/apply", json=task_body(["true"], name="one"))
        assert (await finished_run(c, "one"))["status"] == "done"
        assert heard == [], "no runs pass was asked for"
