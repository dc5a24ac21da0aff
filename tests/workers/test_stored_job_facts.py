"""A job's scheduling facts are written with it at apply (the same facts the scheduler would derive from its
specs), and a job stored without them, as an older corral wrote it, is still read and scheduled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import sqlalchemy as sa

from corral.domain.job_facts import decode
from corral.store.tables import jobs, runs
from corral.workers.queued_jobs import stored_facts
from corral.workers.scheduling import Scheduling
from server_harness import fleet_body, get_run, make_settings, running_server, task_body, wait_for


async def test_facts_are_written_at_apply_and_a_job_stored_without_them_is_scheduled(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..1"))
        await c.post("/api/project/main/runs/apply", json=task_body(["sleep 600"], name="holder"))
        await wait_for(lambda: _status_in(c, "holder", "running"))
        waiter = task_body(
            ["true"], name="waiter", fleets=["fl"], retry={"on_events": ["no-capacity"], "duration": "1h"}
        )
        await c.post("/api/project/main/runs/apply", json=waiter)
        await wait_for(lambda: _waiting(c, "waiter"))

        async with s.ctx.db.read() as conn:
            row = (
                await conn.execute(
                    sa.select(jobs.c.id, jobs.c.scheduling_facts, jobs.c.job_spec, runs.c.run_spec)
                    .join(runs, runs.c.id == jobs.c.run_id)
                    .where(jobs.c.run_name == "waiter")
                )
            ).one()
        written = decode(row.scheduling_facts)
        assert written is not None and written.fleet_names == ("fl",) and written.wait.seconds == 3600.0
        assert written == stored_facts(orjson.loads(row.run_spec), orjson.loads(row.job_spec))

        # as an older corral stored it: no facts (a fresh worker reads the queue whole, as after a restart)
        async with s.ctx.db.write() as conn:
            await conn.execute(sa.update(jobs).where(jobs.c.id == row.id).values(scheduling_facts=None))
        result = await Scheduling(s.ctx).pass_once()
        assert not result.failed and not result.assigned  # read (from its specs), and still waiting
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["holder"], "abort": True})
        await wait_for(lambda: _status_in(c, "holder", "terminated", "failed", "done"))

        async def placed() -> bool:
            await Scheduling(s.ctx).pass_once()
            return await _status_in(c, "waiter", "provisioning", "pulling", "running", "done")

        await wait_for(placed)
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["waiter"], "abort": True})


async def _status_in(c: Any, name: str, *statuses: str) -> bool:
    return (await get_run(c, name))["status"] in statuses


async def _waiting(c: Any, name: str) -> bool:
    return bool((await get_run(c, name))["latest_job_submission"]["corral_waiting"])
