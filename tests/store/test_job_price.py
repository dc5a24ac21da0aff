"""A job's price is stored when it is placed (the commit point writes it with the placement), so a run's cost
(``runs/get``'s ``cost``) is the stored price times the time on the instance: a later price change rewrites
nothing, jobs on local hosts cost nothing, a cloud's fallback launch charges what was launched, and jobs
stored before prices were cost 0."""

from __future__ import annotations

import json
import time
from typing import Any

import sqlalchemy as sa
from alembic import command

from corral.domain.resources import InstanceResources
from corral.scheduler.types import Assign, Gang, Offer, Plan, Reserve
from corral.services import serialize
from corral.store import runs as run_store
from corral.store.db import Database
from corral.store.instance_outcomes import ProvisionedInstance, record_provisioned
from corral.store.migrate import alembic_config, upgrade
from corral.store.plan_apply import apply_plan
from corral.store.tables import fleets, instances, jobs
from store_rows import a_run, admin_and_project

HOUR = 3600.0
#: A cloud offer at a price of the test's own (not the catalogue's).
CLOUD = Offer("aws", "m7i.large", "us-east-1", 1.5, InstanceResources(cpus=2, memory_mib=8192, disk_size_mib=100_000))
JPD = json.dumps({"backend": "aws", "instance_id": "i-0123456789abcdef0", "price": 1.5})


async def _fleet_and_run(conn: Any, now: float) -> None:
    await admin_and_project(conn, now)
    spec = {"configuration": {"type": "fleet", "name": "f", "nodes": {"min": 0, "max": 3}}}
    await conn.execute(
        sa.insert(fleets).values(
            id="f", project_id="p", name="f", created_at=now, last_processed_at=now, status="active",
            spec=json.dumps(spec), deleted=False,
        )
    )  # fmt: skip
    await a_run(conn, "r", now, name="priced")


async def _job(conn: Any, job_id: str, num: int, now: float) -> None:
    await conn.execute(
        sa.insert(jobs).values(
            id=job_id, run_id="r", project_id="p", run_name="priced", job_num=num, replica_num=0, job_name=job_id,
            submission_num=0, deployment_num=0, submitted_at=now, last_processed_at=now, status="submitted",
            job_spec="{}", priority=0, blocks=1, log_offset=0,
        )
    )  # fmt: skip


async def _instance(conn: Any, inst_id: str, backend: str, price: float, now: float) -> None:
    await conn.execute(
        sa.insert(instances).values(
            id=inst_id, project_id="p", fleet_id="f", name=inst_id, instance_num=1 if backend == "aws" else 2,
            status="idle", unreachable=False, backend=backend, price=price, total_blocks=1, busy_blocks=0,
            created_at=now, last_processed_at=now, deleted=False, agent=json.dumps({"url": "http://127.0.0.1:9"}),
        )
    )  # fmt: skip


async def _db(url: str, placed: list[str]) -> Database:
    db = Database(url)
    await upgrade(db)
    now = time.time()
    async with db.write() as conn:
        await _fleet_and_run(conn, now)
        for num, job_id in enumerate(placed):
            await _job(conn, job_id, num, now)
    return db


async def _prices(db: Database) -> dict[str, tuple[float | None, float | None]]:
    async with db.read() as conn:
        rows = await conn.execute(sa.select(jobs.c.id, jobs.c.price, jobs.c.placed_at))
        return {r.id: (r.price, r.placed_at) for r in rows}


async def _cost(db: Database, now: float) -> float:
    async with db.read() as conn:
        run = await run_store.get_run(conn, "p", run_name="priced")
    assert run is not None
    return float(serialize.run(run, now=now)["cost"])


async def test_the_price_is_stored_at_placement_and_a_later_change_rewrites_no_cost(db_url: str) -> None:
    db = await _db(db_url, ["new", "on-local", "on-cloud"])
    t = time.time()
    async with db.write() as conn:
        await _instance(conn, "cloud", "aws", 2.0, t)
        await _instance(conn, "here", "local", 9.0, t)  # a price on a local host is charged nothing
    plan = Plan(
        (
            Gang("g1", (Reserve("f", CLOUD, 1, 1, job_id="new"),)),
            Gang("g2", (Assign("on-local", "here", 1),)),
            Gang("g3", (Assign("on-cloud", "cloud", 1),)),
        )
    )
    await apply_plan(db, plan, t)
    assert await _prices(db) == {"new": (1.5, t), "on-local": (0.0, t), "on-cloud": (2.0, t)}
    assert await _cost(db, t + HOUR) == 0.0  # none of them got its instance yet (no provisioning data)
    async with db.write() as conn:
        await conn.execute(sa.update(jobs).values(job_provisioning_data=JPD))
        await conn.execute(sa.update(jobs).where(jobs.c.id == "on-cloud").values(finished_at=t + HOUR / 2))
    # 1.5 $/h for an hour (still running) + 2.0 $/h for half an hour (finished) + nothing on the local host
    assert await _cost(db, t + HOUR) == 2.5
    async with db.write() as conn:
        await conn.execute(sa.update(instances).values(price=99.0))  # the catalogue's price changed since
    assert await _cost(db, t + HOUR) == 2.5
    assert await _prices(db) == {"new": (1.5, t), "on-local": (0.0, t), "on-cloud": (2.0, t)}
    await db.dispose()


async def test_a_fallback_launched_at_another_price_charges_its_jobs_that_price(db_url: str) -> None:
    db = await _db(db_url, ["waits"])
    t = time.time()
    result = await apply_plan(db, Plan((Gang("g", (Reserve("f", CLOUD, 1, 1, job_id="waits"),)),)), t)
    (inst_id,) = result.reserved
    async with db.write() as conn:
        await conn.execute(
            sa.update(instances).where(instances.c.id == inst_id).values(lock_token="tok", lock_owner="me")
        )
        found = ProvisionedInstance(
            agent={"url": "http://127.0.0.1:9"}, hostname="10.0.0.5", offer={"price": 3.25}, total_blocks=1,
            region="us-west-2", price=3.25, jobs_price=3.25,
        )  # fmt: skip
        assert await record_provisioned(conn, inst_id, "tok", found, t + 60)
    assert await _prices(db) == {"waits": (3.25, t)}
    await db.dispose()


async def test_jobs_stored_before_prices_were_load_and_cost_nothing(db_url: str) -> None:
    db = Database(db_url)
    t = time.time()

    def to(rev: str) -> Any:
        def run(sync_conn: sa.Connection) -> None:
            cfg = alembic_config()
            cfg.attributes["connection"] = sync_conn
            command.upgrade(cfg, rev)

        return run

    async with db.engine.connect() as conn:
        await conn.run_sync(to("0027"))
        await _fleet_and_run(conn, t)
        await _job(conn, "old", 0, t)
        await conn.execute(sa.update(jobs).values(job_provisioning_data=JPD, status="running"))
        await conn.commit()
        await conn.run_sync(to("head"))
        await conn.commit()
    assert await _prices(db) == {"old": (None, None)}
    assert await _cost(db, t + HOUR) == 0.0
    await db.dispose()
