"""The capacity commit point: stale or concurrent plans never push a fleet past nodes.max."""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import pytest
import sqlalchemy as sa

from corral.domain.resources import InstanceResources
from corral.scheduler.types import Assign, Fail, Gang, Offer, Plan, Reserve, Wait
from corral.store.db import Database
from corral.store.migrate import upgrade
from corral.store.plan_apply import apply_plan
from corral.store.plan_result import JobLease
from corral.store.tables import event_targets, fleets, instances, jobs
from store_rows import a_run, admin_and_project

OFFER = Offer("local", "local", "local", 0.0, InstanceResources(cpus=4, memory_mib=8192, disk_size_mib=100_000))


async def _db(url: str) -> Database:
    db = Database(url)
    await upgrade(db)
    now = time.time()
    async with db.write() as conn:
        await admin_and_project(conn, now)
        spec = {"configuration": {"type": "fleet", "name": "f", "nodes": {"min": 0, "max": 3}}}
        await conn.execute(
            sa.insert(fleets).values(
                id="f",
                project_id="p",
                name="f",
                created_at=now,
                last_processed_at=now,
                status="active",
                spec=json.dumps(spec),
                deleted=False,
            )
        )
        await a_run(conn, "r", now)
    return db


_JOB_NUMS = itertools.count()


async def _job(db: Database, job_id: str) -> None:
    """A job of run ``r`` (each its own job number: one row per submission of a job)."""
    now = time.time()
    async with db.write() as conn:
        await conn.execute(
            sa.insert(jobs).values(
                id=job_id,
                run_id="r",
                project_id="p",
                run_name="r",
                job_num=next(_JOB_NUMS),
                replica_num=0,
                job_name=job_id,
                submission_num=0,
                deployment_num=0,
                submitted_at=now,
                last_processed_at=now,
                status="submitted",
                job_spec="{}",
                priority=0,
                blocks=1,
                log_offset=0,
            )
        )


async def _count(db: Database) -> int:
    async with db.read() as conn:
        q = sa.select(sa.func.count()).select_from(instances).where(instances.c.status != "terminated")
        return int((await conn.execute(q)).scalar_one())


async def _instance(db: Database, inst_id: str, status: str, agent: bool, total_blocks: int = 1) -> None:
    now = time.time()
    async with db.write() as conn:
        await conn.execute(
            sa.insert(instances).values(
                id=inst_id,
                project_id="p",
                fleet_id="f",
                name=inst_id,
                instance_num=0,
                status=status,
                unreachable=False,
                backend="local",
                total_blocks=total_blocks,
                busy_blocks=0,
                created_at=now,
                last_processed_at=now,
                deleted=False,
                agent=json.dumps({"url": "http://127.0.0.1:9", "token": "x"}) if agent else None,
            )
        )


async def test_stale_concurrent_plans_never_exceed_nodes_max(db_url: str) -> None:
    db = await _db(db_url)
    ids = [f"j{i}" for i in range(10)]
    for j in ids:
        await _job(db, j)
    # Every planner saw an empty fleet, so each plans a new instance for its job: 10 stale plans.
    plans = [Plan((Gang(f"g{j}", (Reserve("f", OFFER, 1, 1, job_id=j),)),)) for j in ids]
    results = await asyncio.gather(*(apply_plan(db, p, time.time()) for p in plans))
    assert await _count(db) == 3
    assert sum(len(r.reserved) for r in results) == 3
    assert sum(len(r.rejected_runs) for r in results) == 7
    # Terminating instances still count: nothing more fits until the backend confirms termination.
    async with db.write() as conn:
        await conn.execute(sa.update(instances).values(status="terminating"))
    await _job(db, "late")
    r = await apply_plan(db, Plan((Gang("g", (Reserve("f", OFFER, 1, 1, job_id="late"),)),)), time.time())
    assert r.rejected_runs == ["g"]
    await db.dispose()


async def test_gang_commits_whole_or_not_at_all(db_url: str) -> None:
    db = await _db(db_url)
    for j in ("a", "b", "c", "d"):
        await _job(db, j)
    gang = Gang("r", tuple(Reserve("f", OFFER, 1, 1, job_id=j) for j in ("a", "b", "c", "d")))
    r = await apply_plan(db, Plan((gang,)), time.time())
    assert r.rejected_runs == ["r"] and r.reserved == []
    assert await _count(db) == 0
    await db.dispose()


async def test_assignment_recounts_blocks(db_url: str) -> None:
    db = await _db(db_url)
    await _instance(db, "i", "idle", agent=False, total_blocks=2)
    for j in ("a", "b", "c"):
        await _job(db, j)
    plans = [Plan((Gang(j, (Assign(j, "i", 1),)),)) for j in ("a", "b", "c")]
    results = await asyncio.gather(*(apply_plan(db, p, time.time()) for p in plans))
    assert sum(len(r.assigned) for r in results) == 2
    # A job that is no longer waiting is never failed or re-assigned by a stale plan (which two of the three
    # concurrent plans won is up to the database).
    placed = next(j for r in results for j in r.assigned)
    r = await apply_plan(db, Plan((Gang("x", (Fail(placed, "late"),)),)), time.time())
    assert r.failed == []
    await db.dispose()


async def test_concurrent_reservations_in_different_fleets_never_overfill_the_host(db_url: str) -> None:
    """The host's blocks are shared by every fleet: two commits reserving in different fleets (whose row
    locks do not meet) still cannot both take the last free block, nor the same GPU."""
    db = await _db(db_url)
    async with db.write() as conn:
        spec = {"configuration": {"type": "fleet", "name": "f2", "nodes": {"min": 0, "max": 3}}}
        now = time.time()
        values = {"created_at": now, "last_processed_at": now, "status": "active", "deleted": False}
        await conn.execute(
            sa.insert(fleets).values(id="f2", project_id="p", name="f2", spec=json.dumps(spec), **values)
        )
    resources = InstanceResources(cpus=1, memory_mib=4096, disk_size_mib=100_000)
    share = Offer("local", "local", "local", 0.0, resources, host_blocks=1, host_total_blocks=2)
    ids = [f"h{i}" for i in range(10)]
    for j in ids:
        await _job(db, j)
    plans = [Plan((Gang(f"g{j}", (Reserve(("f", "f2")[i % 2], share, 1, 1, job_id=j),)),)) for i, j in enumerate(ids)]
    results = await asyncio.gather(*(apply_plan(db, p, time.time(), host_pools={"local": 1}) for p in plans))
    assert sum(len(r.reserved) for r in results) == 1
    assert await _count(db) == 1
    await db.dispose()


async def test_jobs_placed_on_a_ready_instance_are_leased_to_the_committing_replica(db_url: str) -> None:
    """The replica whose commit places a job on an instance whose agent answers holds the job's lease from that
    commit on (it starts the job without claiming it); a job placed on an instance still starting is not leased
    (whoever drives it once its agent answers claims it then)."""
    db = await _db(db_url)
    await _instance(db, "ready", "idle", agent=True)
    await _instance(db, "starting", "provisioning", agent=False)
    for j in ("a", "b"):
        await _job(db, j)
    now = time.time()
    plan = Plan((Gang("r", (Assign("a", "ready", 1), Assign("b", "starting", 1))),))
    result = await apply_plan(db, plan, now, lease=JobLease("replica-1", 60.0))
    assert sorted(result.assigned) == ["a", "b"]
    assert list(result.leased) == ["a"]
    async with db.read() as conn:
        rows = {r.id: r for r in await conn.execute(sa.select(jobs).where(jobs.c.id.in_(["a", "b"])))}
    assert rows["a"].lock_owner == "replica-1" and rows["a"].lock_token == result.leased["a"]
    assert rows["a"].lock_expires_at == pytest.approx(now + 60.0)
    assert rows["b"].lock_owner is None and rows["b"].lock_token is None
    await db.dispose()


async def test_a_rejected_gang_leaves_no_events_and_no_lease(db_url: str) -> None:
    """The events of a commit are written together before it commits: those of a gang rejected at the commit
    point are dropped with its savepoint, while the gang committed beside it keeps its own."""
    db = await _db(db_url)
    await _instance(db, "one", "idle", agent=True)
    await _instance(db, "two", "idle", agent=True)
    for j in ("first", "second", "third"):
        await _job(db, j)
    # g2 places "second" (its events recorded) before "third" finds no room: g2 rolls back whole
    plan = Plan(
        (
            Gang("g1", (Assign("first", "one", 1),)),
            Gang("g2", (Assign("second", "two", 1), Assign("third", "one", 1))),
        )
    )
    result = await apply_plan(db, plan, time.time(), lease=JobLease("replica-1", 60.0))
    assert result.assigned == ["first"] and result.rejected_runs == ["g2"]
    assert list(result.leased) == ["first"]
    async with db.read() as conn:
        q = sa.select(event_targets.c.entity_id).where(event_targets.c.entity_type.in_(["job", "instance"]))
        about = [r.entity_id for r in await conn.execute(q)]
        second = (await conn.execute(sa.select(jobs).where(jobs.c.id == "second"))).one()
    assert "first" in about and "one" in about
    assert "second" not in about and "two" not in about and "third" not in about
    assert second.status == "submitted" and second.lock_owner is None
    await db.dispose()


async def test_a_lone_job_rejected_between_other_gangs_leaves_them_whole(db_url: str) -> None:
    """A gang of one job on an existing instance commits without a savepoint (every check that rejects it
    comes before its first write): rejected, it leaves nothing, and the gangs before and after it commit."""
    db = await _db(db_url)
    await _instance(db, "one", "idle", agent=True)
    for j in ("first", "second", "third"):
        await _job(db, j)
    plan = Plan(
        (
            Gang("g1", (Assign("first", "one", 1),)),
            Gang("g2", (Assign("second", "one", 1),)),  # "one" is full by then
            Gang("g3", (Wait("third", "Waiting for capacity"),)),
        )
    )
    result = await apply_plan(db, plan, time.time(), lease=JobLease("replica-1", 60.0))
    assert result.assigned == ["first"] and result.rejected_runs == ["g2"] and list(result.leased) == ["first"]
    async with db.read() as conn:
        rows = {r.id: r for r in await conn.execute(sa.select(jobs))}
        q = sa.select(event_targets.c.entity_id).where(event_targets.c.entity_type == "job")
        about = {r.entity_id for r in await conn.execute(q)}
        inst = (await conn.execute(sa.select(instances).where(instances.c.id == "one"))).one()
    assert rows["first"].status == "provisioning" and rows["first"].instance_id == "one"
    second = rows["second"]
    assert (second.status, second.instance_id, second.lock_owner, second.status_message) == (
        "submitted",
        None,
        None,
        None,
    )
    assert rows["third"].status_message == "Waiting for capacity"
    assert inst.busy_blocks == 1 and about == {"first"}
    await db.dispose()


async def test_concurrent_plans_taking_instances_in_opposite_orders_do_not_deadlock(db_url: str) -> None:
    """Two replicas' plans assign to the same two instances in opposite orders (each its own queue's order):
    each gang locks its instance's row, so without one order for a whole plan each commit holds one instance
    and waits for the other's (Postgres: ``deadlock detected``, the pass fails and runs again)."""
    db = await _db(db_url)
    await _instance(db, "x", "idle", agent=True, total_blocks=8)
    await _instance(db, "y", "idle", agent=True, total_blocks=8)
    for round_ in range(4):
        jobs_ = [f"r{round_}-{n}" for n in range(4)]
        for j in jobs_:
            await _job(db, j)
        a = Plan((Gang(jobs_[0], (Assign(jobs_[0], "x", 1),)), Gang(jobs_[1], (Assign(jobs_[1], "y", 1),))))
        b = Plan((Gang(jobs_[2], (Assign(jobs_[2], "y", 1),)), Gang(jobs_[3], (Assign(jobs_[3], "x", 1),))))
        results = await asyncio.gather(apply_plan(db, a, time.time()), apply_plan(db, b, time.time()))
        assert sorted(j for r in results for j in r.assigned) == sorted(jobs_)
    await db.dispose()
