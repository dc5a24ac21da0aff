"""A terminated instance is marked deleted, as dstack 0.22.5 marks it when its backend's ``terminate_instance``
returns (``deleted`` with ``status: terminated``, ``server/background/pipeline_tasks/instances/termination.py``): its
fleet no longer lists it (``fleets/get``, by name or, once the fleet is deleted, by id), ``instances/list`` still
does (dstack's lists the deleted instances unless ``only_active``), and its cost stays what it was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa

from corral.store import instance_outcomes, tables
from corral.store.db import Database
from corral.store.migrate import upgrade
from server_harness import finished_run, fleet_body, make_settings, running_server, task_body, wait_for
from store_rows import admin_and_project

#: What dstack 0.22.5's ``fleets/get`` answers of a fleet whose every instance was terminated: none of them (it
#: loads ``FleetModel.instances.and_(InstanceModel.deleted == False)``, ``server/services/fleets.py``).
DSTACK_FLEET_INSTANCES_ONCE_TERMINATED: list[Any] = []


async def test_an_autoscaled_local_instance_terminated_is_deleted_and_leaves_its_fleet(
    db_url: str, tmp_path: Path
) -> None:
    async with running_server(make_settings(tmp_path, database_url=db_url)) as server, server.client() as c:
        r = await c.post("/api/project/main/fleets/apply", json=fleet_body(name="auto", nodes="0..1"))
        assert r.status_code == 200, r.text
        fleet_id = r.json()["id"]
        r = await c.post("/api/project/main/runs/apply", json=task_body(["true"], name="once", fleets=["auto"]))
        assert r.status_code == 200, r.text
        run = await finished_run(c, "once")
        assert run["status"] == "done", run
        cost = run["cost"]
        (inst,) = (await c.post("/api/instances/list", json={})).json()
        r = await c.post("/api/project/main/fleets/delete_instances", json={"name": "auto", "instance_nums": [0]})
        assert r.status_code == 200, r.text

        async def terminated() -> dict[str, Any] | None:
            listed = (await c.post("/api/instances/list", json={})).json()
            return listed[0] if listed and listed[0]["status"] == "terminated" else None

        # instances/list still shows it, terminated (dstack lists the deleted instances); only_active does not
        gone = await wait_for(terminated, timeout=30)
        assert gone["id"] == inst["id"] and gone["finished_at"] is not None
        assert (await c.post("/api/instances/list", json={"only_active": True})).json() == []
        async with server.ctx.db.read() as conn:
            row = (await conn.execute(sa.select(tables.instances).where(tables.instances.c.id == inst["id"]))).one()
        assert row.deleted and row.status == "terminated"
        fleet = (await c.post("/api/project/main/fleets/get", json={"name": "auto"})).json()
        assert fleet["instances"] == DSTACK_FLEET_INSTANCES_ONCE_TERMINATED
        # the fleet deleted and read by id (dstack's fleets/get returns deleted fleets by id): still none of them
        assert (await c.post("/api/project/main/fleets/delete", json={"names": ["auto"]})).status_code == 200

        async def deleted_fleet() -> dict[str, Any] | None:
            got = (await c.post("/api/project/main/fleets/get", json={"id": fleet_id})).json()
            return dict(got) if got["status"] == "terminated" else None

        assert (await wait_for(deleted_fleet, timeout=30))["instances"] == DSTACK_FLEET_INSTANCES_ONCE_TERMINATED
        # the run's cost is what it was, and the instance's own record is kept (instances/get by id)
        assert (await c.post("/api/project/main/runs/get", json={"run_name": "once"})).json()["cost"] == cost
        r = await c.post("/api/project/main/instances/get", json={"id": inst["id"]})
        assert r.status_code == 200 and r.json()["status"] == "terminated" and r.json()["price"] == inst["price"]


async def test_an_instance_its_cloud_took_away_or_never_gave_is_deleted_too(db_url: str) -> None:
    """A spot interruption (``record_lost``): the machine is gone, as after a termination the backend confirmed; a
    cloud instance that could not be provisioned is deleted too, as dstack deletes it (its placeholder at once, a
    fleet's at its next consolidation); an SSH fleet's host that failed is kept, listed with its error until the
    fleet is applied again."""
    db = Database(db_url)
    await upgrade(db)
    async with db.write() as conn:
        await admin_and_project(conn, 0.0)
        await conn.execute(
            sa.insert(tables.fleets).values(
                id="f", project_id="p", name="f", created_at=1.0, last_processed_at=1.0, status="active", spec="{}",
                deleted=False,
            )
        )  # fmt: skip
        for iid, status, backend in (("spot", "busy", "aws"), ("host", "pending", "ssh"), ("vm", "pending", "aws")):
            await conn.execute(
                sa.insert(tables.instances).values(
                    id=iid, project_id="p", fleet_id="f", name=iid, instance_num=0, status=status, unreachable=False,
                    backend=backend, busy_blocks=0, created_at=2.0, last_processed_at=2.0, deleted=False,
                    lock_token="tok",
                )
            )  # fmt: skip
        assert await instance_outcomes.record_lost(conn, "spot", "The spot instance was interrupted", 3.0)
        no_capacity = ("failed_to_start_due_to_no_capacity", "no capacity")
        await instance_outcomes.record_provisioning_failed(
            conn, "host", "tok", "host", "no route to host", no_capacity, 3.0
        )
        await instance_outcomes.record_provisioning_failed(
            conn, "vm", "tok", "vm", "InsufficientInstanceCapacity", no_capacity, 3.0
        )
    async with db.read() as conn:
        rows = {r.id: r for r in await conn.execute(sa.select(tables.instances))}
    assert (rows["spot"].status, rows["spot"].deleted, rows["spot"].price) == ("terminated", True, None)
    assert (rows["host"].status, rows["host"].deleted) == ("terminated", False)
    assert (rows["vm"].status, rows["vm"].deleted) == ("terminated", True)
    await db.dispose()
