"""The commit point holds quota.max: concurrent stale plans (every planner saw the project holding nothing)
from several "replicas" at once, mixing assignments to existing GPU instances and new reservations, never
leave the project's provisioning/running/stopping jobs holding more than its max -- on SQLite and
Postgres. A project without a quota is not limited; a lowered max lets nothing grow."""

from __future__ import annotations

import asyncio
import json
import time

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_plan_apply import _db

from corral.domain.quotas import QuotaPolicy, limits_from_doc
from corral.domain.resources import Gpu, InstanceResources
from corral.scheduler.codec import offer_to_json
from corral.scheduler.types import Assign, Gang, Offer, Plan, Reserve
from corral.store.db import Database
from corral.store.plan_apply import apply_plan
from corral.store.quotas import project_holdings, set_policy
from corral.store.tables import fleets, instances, jobs

H100x2 = InstanceResources(cpus=8, memory_mib=65536, gpus=(Gpu("H100", 81920),) * 2, disk_size_mib=100_000)
OFFER = Offer("ssh", "gpu", "remote", 2.0, H100x2)


async def _setup(db: Database, n_instances: int, n_jobs: int, policy: QuotaPolicy) -> None:
    now = time.time()
    async with db.write() as conn:
        await conn.execute(sa.delete(jobs))
        await conn.execute(sa.delete(instances))
        spec = {"configuration": {"type": "fleet", "name": "f", "nodes": {"min": 0, "max": 40}}}
        await conn.execute(sa.update(fleets).values(spec=json.dumps(spec)))
        for k in range(n_instances):
            await conn.execute(
                sa.insert(instances).values(
                    id=f"i{k}", project_id="p", fleet_id="f", name=f"f-{k}", instance_num=k, status="idle",
                    unreachable=False, backend="ssh", price=2.0, offer=json.dumps(offer_to_json(OFFER)),
                    total_blocks=2, busy_blocks=0, created_at=now, last_processed_at=now, deleted=False,
                )
            )  # fmt: skip
        for j in range(n_jobs):
            await conn.execute(
                sa.insert(jobs).values(
                    id=f"j{j}", run_id="r", project_id="p", run_name="r", job_num=j, replica_num=0,
                    job_name=f"j{j}", submission_num=0, deployment_num=0, submitted_at=now,
                    last_processed_at=now, status="submitted", job_spec="{}", priority=0, blocks=1, log_offset=0,
                )
            )  # fmt: skip
        await set_policy(conn, "p", policy)


def _stale_plans(n_instances: int, n_jobs: int, replicas: int, gang: int) -> list[Plan]:
    """Each replica planned every job as if the project held nothing: one block (one H100) per job, on an
    existing instance or on a new one, gangs of ``gang`` jobs."""
    plans: list[list[Gang]] = [[] for _ in range(replicas)]
    for start in range(0, n_jobs, gang):
        for r in range(replicas):
            decisions: list[Assign | Reserve] = []
            for j in range(start, min(start + gang, n_jobs)):
                slot = (j + r) % (n_instances * 2 + 1)
                if slot < n_instances * 2:
                    decisions.append(Assign(f"j{j}", f"i{slot // 2}", 1))
                else:
                    decisions.append(Reserve("f", OFFER, 1, 2, job_id=f"j{j}"))
            plans[r].append(Gang(f"g{start}", tuple(decisions), "p"))
    return [Plan(tuple(g)) for g in plans]


async def _check(url: str, max_gpu: int, n_instances: int, n_jobs: int, replicas: int, gang: int) -> None:
    db = await _db(url) if url.startswith("new:") else Database(url)
    try:
        await _setup(db, n_instances, n_jobs, QuotaPolicy(max=limits_from_doc({"gpu": {"H100": max_gpu}})))
        plans = _stale_plans(n_instances, n_jobs, replicas, gang)
        await asyncio.gather(*(apply_plan(db, p, time.time()) for p in plans))
        async with db.read() as conn:
            held = (await project_holdings(conn, ["p"])).get("p")
            placed = (
                await conn.execute(sa.select(sa.func.count()).select_from(jobs).where(jobs.c.instance_id.is_not(None)))
            ).scalar_one()
        gpus = held.usage.get("gpu:H100", 0.0) if held else 0.0
        assert gpus <= max_gpu, (gpus, max_gpu)
        assert gpus == placed  # one H100 per placed job: nothing placed uncounted
        # the first commit sees nothing held: its first gang fits whenever the max has room for a gang
        assert placed > 0 or max_gpu < min(gang, n_jobs)
    finally:
        await db.dispose()


def _run_examples(url: str) -> None:
    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        max_gpu=st.integers(0, 6),
        n_instances=st.integers(0, 3),
        n_jobs=st.integers(1, 10),
        replicas=st.integers(2, 4),
        gang=st.sampled_from([1, 1, 2]),
    )
    def example(max_gpu: int, n_instances: int, n_jobs: int, replicas: int, gang: int) -> None:
        asyncio.run(_check(url, max_gpu, n_instances, n_jobs, replicas, gang))

    example()


async def _migrated(url: str) -> str:
    db = await _db(url)
    await db.dispose()
    return url


def test_concurrent_stale_plans_never_exceed_quota_max(db_url: str) -> None:
    url = asyncio.run(_migrated(db_url))
    _run_examples(url)


async def test_a_lowered_max_lets_nothing_grow_and_no_quota_means_no_limit(db_url: str) -> None:
    db = await _db(db_url)
    await _setup(db, 2, 4, QuotaPolicy())
    plan = Plan(tuple(Gang(f"g{j}", (Assign(f"j{j}", f"i{j // 2}", 1),), "p") for j in range(3)))
    assert len((await apply_plan(db, plan, time.time())).assigned) == 3  # no policy: no limit
    async with db.write() as conn:
        await set_policy(conn, "p", QuotaPolicy(max=limits_from_doc({"gpu": 2})))  # now above it
    late = await apply_plan(db, Plan((Gang("late", (Assign("j3", "i1", 1),), "p"),)), time.time())
    assert late.rejected_runs == ["late"]
    await db.dispose()


async def test_gangs_of_one_plan_fill_the_max_exactly(db_url: str) -> None:
    """The project's holding is counted once per commit and carried from gang to gang: every gang that fits
    is placed, up to the max exactly, on instances the project already holds jobs on or not, and the next one
    is refused; a refused gang leaves the count as it was."""
    db = await _db(db_url)
    await _setup(db, 2, 6, QuotaPolicy(max=limits_from_doc({"gpu": {"H100": 3}, "instances": 2})))
    placed = [("j0", "i0"), ("j1", "i0"), ("j2", "i1"), ("j3", "i1"), ("j4", "i0")]
    gangs = [Gang(f"g{j}", (Assign(j, i, 1),), "p") for j, i in placed]
    result = await apply_plan(
        db, Plan((*gangs[:2], Gang("new", (Reserve("f", OFFER, 1, 2, job_id="j5"),), "p"), *gangs[2:])), time.time()
    )
    # j0 and j1 on i0, j5 on a new instance: 3 H100s on 2 instances, the max; j2 on a third instance, j3 likewise,
    # and j4, on i0 again, a fourth H100: each above it
    assert (result.assigned, result.rejected_runs) == (["j0", "j1", "j5"], ["gj2", "gj3", "gj4"])
    async with db.read() as conn:
        held = (await project_holdings(conn, ["p"]))["p"].usage
    assert (held["gpu:H100"], held["instances"]) == (3.0, 2.0)
    await db.dispose()
