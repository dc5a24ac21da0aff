"""A gateway's host at the commit point: ``hold_for_gateway`` takes an idle instance of the fleet (busy with
every block), skips a host another gateway has, the commit point places no job on a held instance even though
no job holds its blocks, and ``release_gateway_hold`` gives it back to jobs; a local instance is held as an SSH
host is, a cloud instance never."""

from __future__ import annotations

import json
import time

import sqlalchemy as sa

from corral.scheduler.types import Assign, Gang, Plan
from corral.store import gateways as gateway_store
from corral.store.db import Database
from corral.store.migrate import upgrade
from corral.store.plan_apply import apply_plan, hold_for_gateway, release_gateway_hold
from corral.store.tables import fleets, instances, jobs, runs
from store_rows import a_run, admin_and_project


async def _db(url: str) -> Database:
    """Project ``p``'s SSH fleet ``edge`` with two idle hosts (``h0`` at .1, ``h1`` at .2), and a waiting job."""
    db = Database(url)
    await upgrade(db)
    now = time.time()
    spec = {"configuration": {"type": "fleet", "name": "edge", "ssh_config": {"hosts": ["10.9.0.1", "10.9.0.2"]}}}
    async with db.write() as conn:
        await admin_and_project(conn, now)
        await conn.execute(
            sa.insert(fleets).values(
                id="f", project_id="p", name="edge", created_at=now, last_processed_at=now, status="active",
                spec=json.dumps(spec), deleted=False,
            )
        )  # fmt: skip
        for n in (0, 1):
            await conn.execute(
                sa.insert(instances).values(
                    id=f"h{n}", project_id="p", fleet_id="f", name=f"edge-{n}", instance_num=n, status="idle",
                    unreachable=False, backend="ssh", total_blocks=2, busy_blocks=0, hostname=f"10.9.0.{n + 1}",
                    created_at=now, last_processed_at=now, deleted=False,
                    agent=json.dumps({"url": "http://127.0.0.1:9", "token": "x"}),
                )
            )  # fmt: skip
        await a_run(conn, "r", now)
        await conn.execute(
            sa.insert(jobs).values(
                id="j", run_id="r", project_id="p", run_name="r", job_num=0, replica_num=0, job_name="r-0-0",
                submission_num=0, deployment_num=0, submitted_at=now, last_processed_at=now, status="submitted",
                job_spec="{}", priority=0, blocks=1, log_offset=0,
            )
        )  # fmt: skip
    return db


async def _instance(db: Database, inst_id: str) -> tuple[str, int, str | None]:
    async with db.read() as conn:
        q = sa.select(instances.c.status, instances.c.busy_blocks, instances.c.gateway_id)
        r = (await conn.execute(q.where(instances.c.id == inst_id))).one()
    return r.status, r.busy_blocks, r.gateway_id


async def test_a_held_host_takes_no_job_until_it_is_released(db_url: str) -> None:
    db = await _db(db_url)
    async with db.write() as conn:
        host = await hold_for_gateway(db, conn, "f", "gw-1", set(), time.time())
    assert host is not None and (host.instance_id, host.name, host.hostname) == ("h0", "edge-0", "10.9.0.1")
    assert host.agent == {"url": "http://127.0.0.1:9", "token": "x"}
    assert await _instance(db, "h0") == ("busy", 2, "gw-1")
    async with db.write() as conn:  # h0 is held, h1's address is another gateway's host
        assert await hold_for_gateway(db, conn, "f", "gw-2", {"10.9.0.2"}, time.time()) is None

    # a plan made before the hold (it saw h0 idle) is refused at the commit point
    rejected = await apply_plan(db, Plan((Gang("r", (Assign("j", "h0", 1),)),)), time.time())
    assert rejected.assigned == [] and rejected.rejected_runs == ["r"]

    async with db.write() as conn:
        assert await release_gateway_hold(conn, "h0", "gw-1", time.time())
        assert not await release_gateway_hold(conn, "h0", "gw-1", time.time())  # released once
    assert await _instance(db, "h0") == ("idle", 0, None)
    placed = await apply_plan(db, Plan((Gang("r", (Assign("j", "h0", 1),)),)), time.time())
    assert placed.assigned == ["j"]
    await db.dispose()


async def test_a_local_instance_is_held_and_a_cloud_one_is_not(db_url: str) -> None:
    """An instance of the local backend (this machine) hosts a gateway as an SSH host does; a cloud instance of
    the same fleet is never taken (a gateway on a cloud gets a VM of its own)."""
    db = await _db(db_url)
    async with db.write() as conn:
        await conn.execute(sa.update(instances).where(instances.c.id == "h0").values(backend="aws"))
        await conn.execute(sa.update(instances).where(instances.c.id == "h1").values(backend="local"))
        host = await hold_for_gateway(db, conn, "f", "gw-1", set(), time.time())
    assert host is not None and host.instance_id == "h1", host
    assert await _instance(db, "h0") == ("idle", 0, None)
    assert await _instance(db, "h1") == ("busy", 2, "gw-1")
    async with db.write() as conn:  # only the cloud instance is left idle: nothing to hold
        assert await hold_for_gateway(db, conn, "f", "gw-2", set(), time.time()) is None
    await db.dispose()


async def test_a_gateway_row_is_locked_and_its_services_counted(db_url: str) -> None:
    db = await _db(db_url)
    conf = {"type": "gateway", "name": "gw", "backend": "remote", "region": "edge", "domain": "example.test"}
    async with db.write() as conn:
        made = await gateway_store.create(conn, "p", "gw", conf, "0" * 64, "sealed", time.time(), "u")
        await conn.execute(sa.update(runs).where(runs.c.id == "r").values(gateway_id=made.id))
    async with db.write() as conn:
        got = await gateway_store.locked(conn, made.id)
        assert got is not None and (got.name, got.status, got.wildcard_domain) == ("gw", "submitted", "example.test")
        assert await gateway_store.services_on(conn, made.id) == ["r"]
        assert await gateway_store.service_run_ids(conn, made.id) == ["r"]
        assert await gateway_store.locked(conn, "no-such-gateway") is None
    await db.dispose()
