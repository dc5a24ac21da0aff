"""What the scheduler reads: the queue of unplaced jobs (with their run specs) and the fleets."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.records import FleetRec
from corral.scheduler.blocks import HOST_GPUS_KEY
from corral.store.fleets import list_fleets
from corral.store.tables import instances, jobs, projects, runs, users


@dataclass(frozen=True)
class QueueRow:
    """A submitted job without an instance. The documents are loaded only for jobs the caller has not
    seen yet (``known``), so a long queue costs one narrow query per pass, not a JSON parse per job."""

    id: str
    run_id: str
    project_id: str
    project_name: str
    run_name: str
    job_num: int
    priority: int
    submitted_at: float
    status_message: str | None
    job_spec: dict[str, Any] | None
    run_spec: dict[str, Any] | None
    #: The global role of the run's submitter (loaded with the documents).
    submitter_role: str | None = None
    #: A preempted job's new submission: the time it keeps its place by (``jobs.queued_at``).
    queued_at: float | None = None


def _waiting() -> sa.Select[Any]:
    """Jobs waiting to be placed, in the scheduler's order: priority (higher first), then submission time."""
    return (
        sa.select(
            jobs.c.id,
            jobs.c.run_id,
            jobs.c.project_id,
            jobs.c.run_name,
            jobs.c.job_num,
            jobs.c.priority,
            jobs.c.submitted_at,
            jobs.c.status_message,
            jobs.c.queued_at,
            projects.c.name.label("project_name"),
        )
        .join(projects, projects.c.id == jobs.c.project_id)
        .where(jobs.c.status == "submitted", jobs.c.instance_id.is_(None))
        .order_by(jobs.c.priority.desc(), sa.func.coalesce(jobs.c.queued_at, jobs.c.submitted_at), jobs.c.id)
    )


async def waiting_jobs(conn: AsyncConnection, project_ids: Collection[str] | None = None) -> list[Any]:
    """The queue's rows without their documents (``scheduling/queue``), of ``project_ids`` only if given."""
    q = _waiting().where(projects.c.deleted.is_(False))
    if project_ids is not None:
        q = q.where(jobs.c.project_id.in_(list(project_ids)))
    return list((await conn.execute(q)).all())


async def load_queue(conn: AsyncConnection, known: Collection[str] = ()) -> list[QueueRow]:
    """The queue in order: priority (higher first), then submission time."""
    rows = (await conn.execute(_waiting())).all()
    unknown = [r.id for r in rows if r.id not in known]
    docs: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {}
    for start in range(0, len(unknown), 500):
        chunk = unknown[start : start + 500]
        dq = (
            sa.select(jobs.c.id, jobs.c.job_spec, runs.c.run_spec, users.c.global_role)
            .join(runs, runs.c.id == jobs.c.run_id)
            .join(users, users.c.id == runs.c.user_id)
        )
        for d in await conn.execute(dq.where(jobs.c.id.in_(chunk))):
            docs[d.id] = (orjson.loads(d.job_spec), orjson.loads(d.run_spec), d.global_role)
    out = []
    for r in rows:
        job_spec, run_spec, role = docs.get(r.id, (None, None, None))
        out.append(
            QueueRow(
                r.id,
                r.run_id,
                r.project_id,
                r.project_name,
                r.run_name,
                r.job_num,
                r.priority,
                r.submitted_at,
                r.status_message,
                job_spec,
                run_spec,
                role,
                r.queued_at,
            )
        )
    return out


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


async def host_blocks_used(conn: AsyncConnection, backend: str) -> int:
    """Blocks of ``backend``'s host held by its instances not yet confirmed terminated (each instance's
    offer says how many it was carved out of; instances reserved before hosts were split hold none)."""
    q = sa.select(instances.c.offer).where(
        instances.c.backend == backend, instances.c.status != "terminated", instances.c.deleted.is_(False)
    )
    used = 0
    for (offer,) in await conn.execute(q):
        data = orjson.loads(offer) if isinstance(offer, (str, bytes)) else offer
        if isinstance(data, dict):
            used += int(data.get("host_blocks") or 0)
    return used


async def host_gpus_held(conn: AsyncConnection, backend: str) -> set[int]:
    """The GPUs (host indexes) of ``backend``'s host that its instances not yet confirmed terminated own
    (each instance's offer records the ones it was given when it was carved)."""
    q = sa.select(instances.c.offer).where(
        instances.c.backend == backend, instances.c.status != "terminated", instances.c.deleted.is_(False)
    )
    held: set[int] = set()
    for (offer,) in await conn.execute(q):
        data = orjson.loads(offer) if isinstance(offer, (str, bytes)) else offer
        gpus = data.get(HOST_GPUS_KEY) if isinstance(data, dict) else None
        if isinstance(gpus, list):
            held.update(i for i in gpus if isinstance(i, int))
    return held
