"""``corral_queue_length``'s counts as the store reads them: the jobs waiting in the queue by project and the fleet
their run is bound to, whatever the finished runs beside them."""

from __future__ import annotations

import sqlalchemy as sa

from corral.store import prometheus, tables
from corral.store.db import Database
from corral.store.migrate import upgrade
from store_rows import a_run, admin_and_project


def _job(job_id: str, run_id: str, status: str, instance_id: str | None = None, replica: int = 0) -> dict[str, object]:
    return {
        "id": job_id, "run_id": run_id, "project_id": "p", "run_name": run_id, "job_num": 0, "replica_num": replica,
        "job_name": f"{run_id}-0-{replica}", "submission_num": 0, "deployment_num": 0, "submitted_at": 1.0,
        "last_processed_at": 1.0, "status": status, "job_spec": "{}", "priority": 0, "blocks": 1, "log_offset": 0,
        "instance_id": instance_id,
    }  # fmt: skip


async def test_queue_lengths_by_project_and_the_fleet_a_run_is_bound_to(db_url: str) -> None:
    db = Database(db_url)
    await upgrade(db)
    async with db.write() as conn:
        await admin_and_project(conn, 0.0)
        await conn.execute(
            sa.insert(tables.fleets).values(
                id="f", project_id="p", name="gpus", created_at=0.0, last_processed_at=0.0, status="active", spec="{}",
                deleted=False,
            )
        )  # fmt: skip
        await conn.execute(
            sa.insert(tables.instances).values(
                id="i", project_id="p", fleet_id="f", name="i", instance_num=0, status="busy", unreachable=False,
                backend="ssh", busy_blocks=1, created_at=0.0, last_processed_at=0.0, deleted=False,
            )
        )  # fmt: skip
        for run_id, status in (("bound", "running"), ("waiting", "submitted"), ("old", "done")):
            await a_run(conn, run_id, 1.0, status)
        await conn.execute(sa.update(tables.runs).where(tables.runs.c.id == "bound").values(fleet_id="f"))
        await conn.execute(
            sa.insert(tables.jobs),
            [
                _job("b0", "bound", "running", "i"),  # placed: not in the queue
                _job("b1", "bound", "submitted", replica=1),  # a later replica of a run placed in fleet gpus
                _job("w0", "waiting", "submitted"),
                _job("w1", "waiting", "submitted", replica=1),
                _job("o0", "old", "done", "i"),
            ],
        )
    async with db.read() as conn:
        assert await prometheus.queue_lengths(conn) == {("main", ""): 2, ("main", "gpus"): 1}
    async with db.write() as conn:
        await conn.execute(sa.update(tables.jobs).values(instance_id="i", status="running"))
    async with db.read() as conn:
        assert await prometheus.queue_lengths(conn) == {}
    await db.dispose()
