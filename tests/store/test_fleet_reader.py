"""The scheduling pass's reader of the fleets (SQLite and Postgres): an instance written by any of the store's
writers since the last read is read again, one nobody wrote is the record the last read made (not read whole
again), and instances and fleets that came or went are seen to."""

from __future__ import annotations

import json
import time

import sqlalchemy as sa
from test_plan_apply import _db, _job

from corral.domain.records import FleetRec, InstanceRec
from corral.scheduler.types import Assign, Gang, Plan
from corral.store import fleets as fleet_store
from corral.store import leases
from corral.store.db import Database
from corral.store.fleet_reader import FleetReader
from corral.store.plan_apply import apply_plan
from corral.store.tables import fleets, instances, jobs


async def _host(db: Database, instance_id: str, num: int, fleet_id: str = "f") -> None:
    now = time.time()
    async with db.write() as conn:
        await conn.execute(
            sa.insert(instances).values(
                id=instance_id, project_id="p", fleet_id=fleet_id, name=f"{fleet_id}-{num}", instance_num=num,
                status="idle", unreachable=False, backend="ssh", price=0.0, total_blocks=2, busy_blocks=0,
                offer=json.dumps({"backend": "ssh"}), created_at=now, last_processed_at=now, deleted=False,
            )
        )  # fmt: skip


async def _read(db: Database, reader: FleetReader) -> dict[str, InstanceRec]:
    async with db.read() as conn:
        found: list[FleetRec] = await reader.read(conn)
    return {i.id: i for f in found for i in f.instances}


async def test_only_what_was_written_since_is_read_again(db_url: str) -> None:
    db = await _db(db_url)
    for n in range(4):
        await _host(db, f"h{n}", n)
    reader = FleetReader()
    first = await _read(db, reader)
    assert sorted(first) == ["h0", "h1", "h2", "h3"]
    again = await _read(db, reader)
    assert again == first and all(rec is first[i] for i, rec in again.items()), "nothing written: the same records"

    # a job placed by the commit point, a host's check, a lease taken, a release: each writer moves the version
    await _job(db, "j")
    assert (await apply_plan(db, Plan((Gang("j", (Assign("j", "h0", 1),)),)), time.time())).assigned == ["j"]
    async with db.write() as conn:
        await fleet_store.update_instance(conn, "h1", {"unreachable": True})
        assert await leases.claim(conn, instances, "h2", "worker", time.time(), 60.0)
    now = await _read(db, reader)
    assert (now["h0"].busy_blocks, now["h1"].unreachable) == (1, True)
    assert now["h2"] is not first["h2"] and now["h3"] is first["h3"]
    async with db.write() as conn:
        await conn.execute(sa.update(jobs).where(jobs.c.id == "j").values(status="terminated"))
        await fleet_store.release_instance(conn, "h0", time.time())
    assert (await _read(db, reader))["h0"].busy_blocks == 0

    # a host added, one terminated, one deleted; then the fleet deleted
    await _host(db, "h4", 4)
    async with db.write() as conn:
        await conn.execute(sa.update(instances).where(instances.c.id == "h1").values(status="terminated"))
        await conn.execute(sa.update(instances).where(instances.c.id == "h2").values(deleted=True))
    assert sorted(await _read(db, reader)) == ["h0", "h3", "h4"]
    async with db.write() as conn:
        await conn.execute(sa.update(fleets).where(fleets.c.id == "f").values(deleted=True))
    assert await _read(db, reader) == {}
    await db.dispose()


async def test_the_records_are_in_instance_order_with_their_fleet_and_project_names(db_url: str) -> None:
    db = await _db(db_url)
    for n in (2, 0, 1):
        await _host(db, f"h{n}", n)
    async with db.read() as conn:
        (fleet,) = await FleetReader().read(conn)
        (listed,) = await fleet_store.list_fleets(conn, None)
    assert fleet == listed, "the fleet as fleets/list reads it"
    assert [i.instance_num for i in fleet.instances] == [0, 1, 2]
    assert {(i.project_name, i.fleet_name) for i in fleet.instances} == {("main", "f")}
    await db.dispose()
