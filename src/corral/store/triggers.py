"""Scheduled runs' triggers (``schedule``): which pending runs wait for one, and firing one -- claimed in
one short transaction, so that across server replicas a trigger fires once.

A scheduled run is written ``pending`` with no jobs, its crons (``runs.schedule``), the time of its next
trigger (``runs.next_triggered_at``) and the jobs a trigger submits (``runs.job_templates``: the job rows
as ``runs/apply`` would have inserted them, specs sealed). :func:`fire` moves the run from ``pending`` to
``submitted`` only if it still waits for the trigger it was read with (compare-and-set on status and
time), and inserts the jobs as a new submission in the same transaction; a second replica firing the
same trigger updates no row and inserts nothing (and the unique index on a job's submissions would stop
it anyway). The runs worker puts a finished scheduled run back to ``pending`` with its next trigger.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.events import job_target
from corral.store.events import emit, tracked_update
from corral.store.tables import jobs, runs


@dataclass(frozen=True)
class Waiting:
    """A pending scheduled run and the trigger it waits for."""

    id: str
    name: str
    next_triggered_at: float


async def waiting_runs(conn: AsyncConnection) -> list[Waiting]:
    """Every pending run that waits for a trigger (one narrow, indexed query)."""
    rows = await conn.execute(
        sa.select(runs.c.id, runs.c.run_name, runs.c.next_triggered_at).where(
            runs.c.status == "pending", runs.c.next_triggered_at.is_not(None), runs.c.deleted == sa.false()
        )
    )
    return [Waiting(r.id, r.run_name, float(r.next_triggered_at)) for r in rows]


def templates_dump(job_values: Sequence[dict[str, Any]]) -> str:
    """The jobs a trigger submits, from the job rows ``runs/apply`` built (their specs already sealed)."""
    keep = ("run_name", "job_num", "replica_num", "job_name", "job_spec", "scheduling_facts", "priority", "ready")
    return orjson.dumps([{k: v.get(k) for k in keep} for v in job_values]).decode()


async def fire(conn: AsyncConnection, run_id: str, trigger_at: float, now: float) -> bool:
    """Submit the run's jobs for the trigger at ``trigger_at`` if the run still waits for it; False if
    another replica fired it first, the run was stopped or deleted, or it has no templates."""
    where = sa.and_(
        runs.c.id == run_id,
        runs.c.status == "pending",
        runs.c.next_triggered_at == trigger_at,
        runs.c.deleted == sa.false(),
    )
    row = (await conn.execute(sa.select(runs.c.project_id, runs.c.job_templates).where(where))).first()
    if row is None or not row.job_templates:
        return False
    claimed = await tracked_update(
        conn,
        runs,
        where,
        {"status": "submitted", "status_message": None, "termination_reason": None, "fleet_id": None,
         "last_processed_at": now},
    )  # fmt: skip
    if not claimed:
        return False
    templates = orjson.loads(row.job_templates)
    previous = (
        await conn.execute(sa.select(sa.func.max(jobs.c.submission_num)).where(jobs.c.run_id == run_id))
    ).scalar()
    number = 0 if previous is None else int(previous) + 1
    values = [
        {
            "id": str(uuid.uuid4()),
            "run_id": run_id,
            "project_id": row.project_id,
            "run_name": t["run_name"],
            "job_num": t["job_num"],
            "replica_num": t["replica_num"],
            "job_name": t["job_name"],
            "submission_num": number,
            "deployment_num": 0,
            "submitted_at": now,
            "last_processed_at": now,
            "status": "submitted",
            "job_spec": t["job_spec"],
            "scheduling_facts": t.get("scheduling_facts"),  # (templates stored before it: derived when queued)
            "priority": t["priority"],
            "blocks": 1,
            "log_offset": 0,
            "ready": t.get("ready"),
        }
        for t in templates
    ]
    await conn.execute(sa.insert(jobs), values)
    for v in values:
        target = job_target(row.project_id, v["id"], v["job_name"], run_id)
        await emit(conn, "Job created on schedule trigger. Status: SUBMITTED", None, [target])
    return True
