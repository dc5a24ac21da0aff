"""What the scheduler reads: the queue's rows (``queue_reader`` reads them pass after pass) and the fleets."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.job_facts import JobFacts
from corral.domain.records import FleetRec
from corral.scheduler.blocks import HOST_GPUS_KEY
from corral.store import direct
from corral.store.fleets import list_fleets
from corral.store.tables import LIVE_INSTANCE_SQL, instances, jobs, projects


@dataclass(frozen=True)
class QueueRow:
    """A submitted job without an instance. Its facts, or where it has none its documents, are loaded only for
    jobs the caller has not seen yet (``queue_reader``)."""

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
    #: Its scheduling facts as written with it (None: written without them, or in a version this code does not
    #: read: ``job_spec`` and ``run_spec`` are loaded instead, to derive them from).
    facts: JobFacts | None = None
    replica_num: int = 0


#: A job waiting to be placed, and the scheduler's order: priority (higher first), then submission time.
_QUEUED = (jobs.c.status == "submitted", jobs.c.instance_id.is_(None))
_ORDER = (jobs.c.priority.desc(), sa.func.coalesce(jobs.c.queued_at, jobs.c.submitted_at), jobs.c.id)


def waiting_columns() -> sa.Select[Any]:
    """What names a job of the queue, with its project's name, for any jobs (no filter, no order)."""
    return sa.select(
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
    ).join(projects, projects.c.id == jobs.c.project_id)


def waiting_query() -> sa.Select[Any]:
    """Jobs waiting to be placed, in the scheduler's order, with what names them."""
    return waiting_columns().where(*_QUEUED).order_by(*_ORDER)


async def waiting_jobs(conn: AsyncConnection, project_ids: Collection[str] | None = None) -> list[Any]:
    """The queue's rows without their documents (``scheduling/queue``), of ``project_ids`` only if given."""
    q = waiting_query().where(projects.c.deleted == sa.false())
    if project_ids is not None:
        q = q.where(jobs.c.project_id.in_(list(project_ids)))
    return list((await conn.execute(q)).all())


async def load_fleets(conn: AsyncConnection, project_ids: list[str] | None = None) -> list[FleetRec]:
    """Active fleets with every instance that counts against their ``nodes.max``."""
    return [f for f in await list_fleets(conn, project_ids) if f.status == "active"]


#: The offers of ``:backend``'s instances not yet confirmed terminated (built once: ``store/prebuilt.py``), from
#: ``ix_instances_live_backend`` (its predicate spelled as the index's), not every instance of the history.
_LIVE_OFFERS = sa.select(instances.c.offer).where(
    instances.c.backend == sa.bindparam("backend"), sa.text(LIVE_INSTANCE_SQL)
)


async def backend_usage(conn: AsyncConnection, backend: str) -> int:
    return (await backend_usage_and_blocks(conn, backend))[0]


async def host_blocks_used(conn: AsyncConnection, backend: str) -> int:
    """Blocks of ``backend``'s host held by its instances not yet confirmed terminated (each instance's
    offer says how many it was carved out of; instances reserved before hosts were split hold none)."""
    return (await backend_usage_and_blocks(conn, backend))[1]


async def backend_usage_and_blocks(conn: AsyncConnection, backend: str) -> tuple[int, int]:
    """How many of ``backend``'s instances are not yet confirmed terminated, and the host's blocks they hold
    (:func:`host_blocks_used`), from one read."""
    count = used = 0
    for (offer,) in await direct.execute(conn, _LIVE_OFFERS, {"backend": backend}):
        count += 1
        data = orjson.loads(offer) if isinstance(offer, (str, bytes)) else offer
        if isinstance(data, dict):
            used += int(data.get("host_blocks") or 0)
    return count, used


async def host_gpus_held(conn: AsyncConnection, backend: str) -> set[int]:
    """The GPUs (host indexes) of ``backend``'s host that its instances not yet confirmed terminated own
    (each instance's offer records the ones it was given when it was carved)."""
    held: set[int] = set()
    for (offer,) in await direct.execute(conn, _LIVE_OFFERS, {"backend": backend}):
        data = orjson.loads(offer) if isinstance(offer, (str, bytes)) else offer
        gpus = data.get(HOST_GPUS_KEY) if isinstance(data, dict) else None
        if isinstance(gpus, list):
            held.update(i for i in gpus if isinstance(i, int))
    return held
