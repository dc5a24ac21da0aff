"""The commit point's check of preemption holds (``scheduler.holds``): blocks a preemption freed on an
instance are promised to the run that preempted for them, so an assignment of another run's job to that
instance may take only what is free beyond them.

The pure scheduler already leaves held blocks to their run; this recount, from the rows, is what keeps a
replica whose plan was made before the victim ended (or before the preemption) from taking them: without
it the preemptor would find the capacity gone and preempt again. A hold is read as the scheduler reads it:
from the ended victim's stop record (``termination_reason_message`` names the preemptor), for
:data:`~corral.scheduler.holds.HOLD_FOR` after the victim ended, while the preemptor has a job waiting.

Imports only SQLAlchemy, the tables and ``corral.scheduler.holds``.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.statuses import UNFINISHED_JOB
from corral.scheduler.holds import HOLD_FOR, preemptor
from corral.store.tables import jobs, projects

#: ``jobs.stop_requested`` of a job stopped to make room for another run (``store.preemption.PREEMPTED``).
_PREEMPTED = "preempted"


async def held_for_others(conn: AsyncConnection, instance_id: str, run_id: str, now: float) -> int:
    """The blocks of ``instance_id`` held for waiting preemptors other than ``run_id``."""
    ended = (
        await conn.execute(
            sa.select(jobs.c.blocks, jobs.c.project_id, jobs.c.termination_reason_message).where(
                jobs.c.instance_id == instance_id,
                jobs.c.stop_requested == _PREEMPTED,
                jobs.c.finished_at >= now - HOLD_FOR,
                jobs.c.status.notin_(UNFINISHED_JOB),
            )
        )
    ).all()
    held = 0
    waiting: dict[tuple[str, str | None, str], bool] = {}
    for blocks, project_id, message in ended:
        who = preemptor(message)
        if who is None:
            continue
        key = (who[0], who[1], project_id)
        if key not in waiting:
            waiting[key] = await _waits_other_than(conn, who[0], who[1], project_id, run_id)
        if waiting[key]:
            held += int(blocks or 1)
    return held


async def _waits_other_than(
    conn: AsyncConnection, run_name: str, project_name: str | None, victim_project_id: str, run_id: str
) -> bool:
    """Whether the preemptor (``run_name`` of ``project_name``, or of the victim's project) is a run other
    than ``run_id`` with a job still waiting to be placed."""
    q = sa.select(jobs.c.run_id).where(
        jobs.c.run_name == run_name,
        jobs.c.status == "submitted",
        jobs.c.instance_id.is_(None),
        jobs.c.run_id != run_id,
    )
    if project_name is None:
        q = q.where(jobs.c.project_id == victim_project_id)
    else:
        named = sa.select(projects.c.id).where(projects.c.name == project_name, projects.c.deleted == sa.false())
        q = q.where(jobs.c.project_id.in_(named))
    return (await conn.execute(q.limit(1))).first() is not None
