"""Rows the store and worker tests start from, inserted directly: an admin user ``u`` and its project ``p``
(``main``), and runs of it."""

from __future__ import annotations

import json
import time

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store.db import Database
from corral.store.tables import jobs, projects, runs, users


async def admin_and_project(conn: AsyncConnection, now: float) -> None:
    """User ``u`` (a global admin, ``admin``) and project ``p`` (``main``, owned by ``u``, no backends)."""
    await conn.execute(
        sa.insert(users).values(
            id="u", name="admin", token="t", token_hash="h", global_role="admin", active=True, deleted=False,
            created_at=now,
        )
    )  # fmt: skip
    await conn.execute(
        sa.insert(projects).values(
            id="p", name="main", owner_id="u", created_at=now, is_public=False, deleted=False, backends="[]"
        )
    )


async def another_project(conn: AsyncConnection, now: float, project_id: str, name: str) -> None:
    """Project ``project_id`` (``name``, owned by ``u``, no backends) beside ``p``."""
    await conn.execute(
        sa.insert(projects).values(
            id=project_id, name=name, owner_id="u", created_at=now, is_public=False, deleted=False, backends="[]"
        )
    )


async def a_run(conn: AsyncConnection, run_id: str, now: float, status: str = "submitted", name: str = "") -> None:
    """Run ``run_id`` of project ``p`` by user ``u`` (named ``name``, else its id), with an empty spec."""
    await conn.execute(
        sa.insert(runs).values(
            id=run_id, project_id="p", user_id="u", run_name=name or run_id, submitted_at=now, last_processed_at=now,
            status=status, run_spec="{}", priority=0, deployment_num=0, deleted=False,
        )
    )  # fmt: skip


async def two_runs_settling(db: Database) -> None:
    """Two runs of one job still ``provisioning`` in project ``p``: ``ran``, whose job is done, and ``started``,
    whose job is running (what the runs worker settles next)."""
    now = time.time()
    async with db.write() as conn:
        await admin_and_project(conn, now)
        spec = json.dumps({"configuration": {"type": "task", "commands": ["true"]}})
        for name, job_status in (("ran", "done"), ("started", "running")):
            await conn.execute(
                sa.insert(runs).values(
                    id=name, project_id="p", user_id="u", run_name=name, submitted_at=now, last_processed_at=now,
                    status="provisioning", run_spec=spec, priority=0, deployment_num=0, deleted=False,
                )
            )  # fmt: skip
            await conn.execute(
                sa.insert(jobs).values(
                    id=f"{name}-0", run_id=name, project_id="p", run_name=name, job_num=0, replica_num=0,
                    job_name=f"{name}-0", submission_num=0, deployment_num=0, submitted_at=now,
                    last_processed_at=now, status=job_status, job_spec="{}", priority=0, blocks=1, log_offset=0,
                    finished_at=now if job_status == "done" else None,
                )
            )  # fmt: skip


async def run_statuses(db: Database) -> dict[str, str]:
    """Each run's status, by id."""
    async with db.read() as conn:
        return {r.id: r.status for r in await conn.execute(sa.select(runs.c.id, runs.c.status))}
