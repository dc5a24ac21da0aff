"""What the runs worker reads each pass (``active_run_states(settling=True)``): every run whose status may
have to change, and not the runs only waiting in the queue (``submitted``, every job of every submission a
``submitted`` task job nobody asked to stop) nor the ``pending`` ones -- on SQLite and Postgres."""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from test_plan_apply import _db

from corral.store.run_states import active_run_states
from corral.store.tables import jobs, runs


def _run(run_id: str, status: str) -> dict[str, Any]:
    now = time.time()
    return {
        "id": run_id, "project_id": "p", "user_id": "u", "run_name": run_id, "submitted_at": now,
        "last_processed_at": now, "status": status, "run_spec": "{}", "priority": 0, "deployment_num": 0,
        "deleted": False,
    }  # fmt: skip


def _job(run_id: str, status: str, submission: int = 0, **extra: Any) -> dict[str, Any]:
    now = time.time()
    return {
        "id": f"{run_id}-{submission}", "run_id": run_id, "project_id": "p", "run_name": run_id, "job_num": 0,
        "replica_num": 0, "job_name": f"{run_id}-0-0", "submission_num": submission, "deployment_num": 0,
        "submitted_at": now, "last_processed_at": now, "status": status, "job_spec": "{}", "priority": 0,
        "blocks": 1, "log_offset": 0, **extra,
    }  # fmt: skip


async def test_only_runs_that_may_change_are_settled(db_url: str) -> None:
    db = await _db(db_url)
    cases = {
        "queued": ("submitted", [_job("queued", "submitted")]),
        "placed": ("submitted", [_job("placed", "provisioning")]),
        "retried": ("submitted", [_job("retried", "failed"), _job("retried", "submitted", 1)]),
        "stopping-queued": ("submitted", [_job("stopping-queued", "submitted", stop_requested="user")]),
        "service": ("submitted", [_job("service", "submitted", ready=False)]),
        "running": ("running", [_job("running", "running")]),
        "terminating": ("terminating", [_job("terminating", "submitted")]),
        "pending": ("pending", [_job("pending", "done")]),
        "done": ("done", [_job("done", "done")]),
    }
    async with db.write() as conn:
        for run_id, (status, run_jobs) in cases.items():
            await conn.execute(sa.insert(runs).values(**_run(run_id, status)))
            for job in run_jobs:
                await conn.execute(sa.insert(jobs).values(**job))
    async with db.read() as conn:
        settled = {r.id for r in await active_run_states(conn, settling=True) if r.id in cases}
        active = {r.id for r in await active_run_states(conn) if r.id in cases}
    assert settled == {"placed", "retried", "stopping-queued", "service", "running", "terminating"}
    assert active == settled | {"queued", "pending"}
    await db.dispose()
