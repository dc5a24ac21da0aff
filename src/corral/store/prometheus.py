"""What ``GET /metrics`` reads: the live instances and jobs (each with its newest metrics sample), the run
counts by project, user and status, and the queue's length by project and fleet.

The instance, job and queue reads cover current state only (rows in a live status, by their status
indexes): their cost follows what runs now, not history. The run counts (dstack's series count every run ever
submitted) are the counts kept with every run's writes (``store/run_counts.py``), not a count of the runs.

Imports ``domain``, sqlalchemy and the store's own modules only. On SQLite the reads go by the driver itself
(``store/direct.py``): a scrape's rows as plain tuples.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.metrics import LIVE_STATUSES, MetricsPoint
from corral.domain.statuses import READY_INSTANCE, InstanceStatus
from corral.store import direct
from corral.store.metrics import latest_points
from corral.store.run_counts import run_type
from corral.store.tables import ACTIVE_RUN_SQL, QUEUED_SQL, fleets, instances, jobs, projects, runs, users

#: The instances the metrics count: neither pending nor terminated.
LIVE_INSTANCE_STATUSES = (InstanceStatus.PROVISIONING, *READY_INSTANCE, InstanceStatus.TERMINATING)


def _doc(text: str | None) -> dict[str, Any]:
    try:
        value = orjson.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class LiveInstance:
    project: str
    fleet: str
    fleet_id: str
    name: str
    id: str
    backend: str
    created_at: float
    price: float
    offer: dict[str, Any]


@dataclass(frozen=True)
class LiveJob:
    project: str
    user: str
    run_name: str
    run_id: str
    job_name: str
    id: str
    job_num: int
    replica_num: int
    run_type: str
    submitted_at: float
    provisioning: dict[str, Any]
    point: MetricsPoint | None


def _status_in(column: str, statuses: tuple[str, ...]) -> sa.TextClause:
    """``column IN (...)`` with the statuses written into the text (our own constants, no input): a statement without
    an expanding parameter runs on SQLite by its driver (``store/direct.py``)."""
    return sa.text(f"{column} IN ({', '.join(repr(str(s)) for s in statuses)})")


_LIVE_INSTANCES = (
    sa.select(
        projects.c.name,
        fleets.c.name,
        instances.c.fleet_id,
        instances.c.name,
        instances.c.id,
        instances.c.backend,
        instances.c.created_at,
        instances.c.price,
        instances.c.offer,
    )
    .join(projects, projects.c.id == instances.c.project_id)
    .outerjoin(fleets, fleets.c.id == instances.c.fleet_id)
    .where(_status_in("instances.status", LIVE_INSTANCE_STATUSES), instances.c.deleted == sa.false())
    .order_by(projects.c.name, instances.c.name)
)


async def live_instances(conn: AsyncConnection) -> list[LiveInstance]:
    return [
        LiveInstance(r[0], r[1] or "", r[2] or "", r[3], r[4], r[5], float(r[6]), float(r[7] or 0.0), _doc(r[8]))
        for r in await direct.execute(conn, _LIVE_INSTANCES)
    ]


_LIVE_JOBS = (
    sa.select(
        projects.c.name,
        users.c.name,
        jobs.c.run_name,
        jobs.c.run_id,
        jobs.c.job_name,
        jobs.c.id,
        jobs.c.job_num,
        jobs.c.replica_num,
        runs.c.run_spec,
        jobs.c.submitted_at,
        jobs.c.job_provisioning_data,
    )
    .join(runs, runs.c.id == jobs.c.run_id)
    .join(projects, projects.c.id == jobs.c.project_id)
    .join(users, users.c.id == runs.c.user_id)
    .where(_status_in("jobs.status", LIVE_STATUSES))
    .order_by(projects.c.name, jobs.c.job_name)
)


async def live_jobs(conn: AsyncConnection) -> list[LiveJob]:
    """The live jobs; those without provisioning data (no series yet) without their run's type or newest sample."""
    rows = (await direct.execute(conn, _LIVE_JOBS)).all()
    points = await latest_points(conn, [r[5] for r in rows if r[10]])
    return [
        LiveJob(
            r[0],
            r[1],
            r[2],
            r[3],
            r[4],
            r[5],
            r[6],
            r[7],
            run_type(r[8]) if r[10] else "",
            float(r[9]),
            _doc(r[10]),
            points.get(r[5]),
        )
        for r in rows
    ]


#: The queued jobs (their project and run) and the active runs bound to a fleet (from the active runs' index), matched
#: in Python: joining each queued job to its run looked each run up by its random id in the index of every run ever
#: (with 1,899 queued jobs beside a million finished runs: 7.8-11.6 ms in process, 5.2-9.2 ms so, at a load of 3).
_QUEUED_JOBS = sa.select(jobs.c.project_id, jobs.c.run_id).where(sa.text(QUEUED_SQL))
_BOUND_RUNS = sa.select(runs.c.id, runs.c.fleet_id).where(sa.text(ACTIVE_RUN_SQL), runs.c.fleet_id.is_not(None))
_PROJECT_NAMES = sa.select(projects.c.id, projects.c.name)


async def queue_lengths(conn: AsyncConnection) -> dict[tuple[str, str], int]:
    """(project, fleet) -> jobs waiting in the queue; the fleet is the one the run is bound to (a later
    replica or node of a run placed before), "" for a run not bound to one yet."""
    queued = (await direct.execute(conn, _QUEUED_JOBS)).all()
    if not queued:
        return {}
    bound: dict[str, str] = {r[0]: r[1] for r in await direct.execute(conn, _BOUND_RUNS)}
    counts = Counter((project_id, bound.get(run_id)) for project_id, run_id in queued)
    wanted = {f for _, f in counts if f is not None}
    named = sa.select(fleets.c.id, fleets.c.name).where(fleets.c.id.in_(wanted))
    fleet_names: dict[str, str] = {r[0]: r[1] for r in await conn.execute(named)}
    project_names: dict[str, str] = {r[0]: r[1] for r in await direct.execute(conn, _PROJECT_NAMES)}
    out: Counter[tuple[str, str]] = Counter()
    for (project_id, fleet_id), n in counts.items():
        if project_id in project_names:
            out[(project_names[project_id], fleet_names.get(fleet_id, "") if fleet_id else "")] += n
    return dict(sorted(out.items()))
