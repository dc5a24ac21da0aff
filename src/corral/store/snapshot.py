"""What the scheduler reads: the queue of unplaced jobs (with their run specs) and the fleets."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.records import FleetRec, JobRec
from corral.store.fleets import list_fleets
from corral.store.runs import job_from_row
from corral.store.tables import instances, jobs, runs


async def load_queue(conn: AsyncConnection) -> list[tuple[JobRec, dict[str, Any]]]:
    """Submitted jobs without an instance, in queue order, each with its run's spec."""
    q = (
        sa.select(jobs, runs.c.run_spec.label("run_spec_text"))
        .join(runs, runs.c.id == jobs.c.run_id)
        .where(jobs.c.status == "submitted", jobs.c.instance_id.is_(None))
        .order_by(jobs.c.priority.desc(), jobs.c.submitted_at, jobs.c.id)
    )
    return [(job_from_row(r), json.loads(r.run_spec_text)) for r in await conn.execute(q)]


async def load_fleets(conn: AsyncConnection, project_ids: list[str] | None = None) -> list[FleetRec]:
    """Active fleets with every instance that counts against their ``nodes.max``."""
    return [f for f in await list_fleets(conn, project_ids) if f.status == "active"]


async def backend_usage(conn: AsyncConnection, backend: str) -> int:
    q = (
        sa.select(sa.func.count())
        .select_from(instances)
        .where(instances.c.backend == backend, instances.c.status != "terminated", instances.c.deleted.is_(False))
    )
    return int((await conn.execute(q)).scalar_one())
