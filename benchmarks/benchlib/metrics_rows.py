"""Rows for the metrics benchmarks: a user, a project, runs with one job each, and their samples, written
straight into a fresh database (the store's tables), in large transactions."""

from __future__ import annotations

import json

import sqlalchemy as sa

from corral.domain.metrics import MetricsPoint
from corral.store import run_counts
from corral.store import tables as t
from corral.store.db import Database
from corral.store.migrate import upgrade

JPD = {
    "backend": "remote",
    "price": 1.5,
    "instance_type": {
        "name": "local",
        "resources": {"cpus": 16, "memory_mib": 131072, "gpus": [{"name": "H200", "memory_mib": 143771}]},
    },
}


async def fresh(url: str) -> Database:
    db = Database(url)
    await upgrade(db)
    async with db.write() as conn:
        await conn.execute(
            sa.insert(t.users),
            {"id": "u", "name": "admin", "token": "x", "token_hash": "h", "global_role": "admin", "created_at": 0.0},
        )
        await conn.execute(sa.insert(t.projects), {"id": "p", "name": "main", "owner_id": "u", "created_at": 0.0})
    return db


async def runs_with_jobs(db: Database, n: int, live: int, now: float) -> list[str]:
    """``n`` runs of one job each, the first ``live`` running (with provisioning data), the rest done."""
    spec = json.dumps({"run_name": "r", "configuration": {"type": "task", "commands": ["train"]}})
    run_rows, job_rows = [], []
    for i in range(n):
        status = "running" if i < live else "done"
        run_rows.append(
            {
                "id": f"r{i}", "project_id": "p", "user_id": "u", "run_name": f"run-{i}", "submitted_at": now - 3600,
                "last_processed_at": now, "status": status, "run_spec": spec, "deleted": False,
            }
        )  # fmt: skip
        job_rows.append(
            {
                "id": f"j{i}", "run_id": f"r{i}", "project_id": "p", "run_name": f"run-{i}", "job_num": 0,
                "replica_num": 0, "job_name": f"run-{i}-0-0", "submission_num": 0, "submitted_at": now - 3600,
                "last_processed_at": now, "status": status, "job_spec": "{}", "priority": 0, "blocks": 1,
                "log_offset": 0, "deployment_num": 0,
                "job_provisioning_data": json.dumps(JPD) if status == "running" else None,
            }
        )  # fmt: skip
    async with db.write() as conn:
        await conn.execute(sa.insert(t.runs), run_rows)
        await conn.execute(sa.insert(t.jobs), job_rows)
        await run_counts.recount(conn)  # written around the store: count them as the store would have
    return [f"j{i}" for i in range(n)]


def samples(start: float, count: int, interval: float, gpus: int = 1) -> list[MetricsPoint]:
    return [
        MetricsPoint(
            int((start + k * interval) * 1_000_000),
            int(k * interval * 1_500_000),
            2 * 10**9 + k,
            10**9 + k,
            tuple(40 * 10**9 for _ in range(gpus)),
            tuple(90 for _ in range(gpus)),
        )
        for k in range(count)
    ]
