"""What the service scaling worker reads and writes: the live services with their replica-group templates
(``runs.service_templates``) and replicas, the requests the proxies counted (``service_request_stats``),
and the worker's decisions applied (new replicas from a template, deployments bumped in place, replicas
taken out of rotation or stopped ``scaled_down``, the run's status message).

Imports the store's tables and the domain's events only.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.events import job_target
from corral.domain.statuses import ACTIVE_RUN, FINISHED_JOB
from corral.store.events import emit, tracked_update
from corral.store.tables import SERVICE_RUN_SQL, jobs, runs, service_request_stats

#: The statuses of a service whose replica counts are kept (a stopping one is left to its stop).
LIVE = ACTIVE_RUN
#: How long counted requests are kept (the longest window, 300 s, and a margin).
STATS_KEEP = 360


@dataclass(frozen=True)
class JobView:
    id: str
    replica_num: int
    submission_num: int
    deployment_num: int
    status: str
    termination_reason: str | None
    termination_reason_message: str | None
    status_message: str | None
    ready: bool | None
    drain_at: float | None
    instance_id: str | None
    stop_requested: str | None
    submitted_at: float
    finished_at: float | None
    job_spec: str


@dataclass(frozen=True)
class ServiceState:
    run_id: str
    project_id: str
    run_name: str
    status: str
    status_message: str | None
    deployment_num: int
    priority: int
    configuration: Mapping[str, Any]
    #: group name -> {"job_spec": stored text, "scheduling_facts": stored text or absent, "deployment_num"}
    templates: Mapping[str, Mapping[str, Any]]
    jobs: tuple[JobView, ...]


#: The live services' runs, read from their own index (``ix_runs_services``), whatever the backlog of tasks.
LIVE_SERVICES = sa.select(
    runs.c.id,
    runs.c.project_id,
    runs.c.run_name,
    runs.c.status,
    runs.c.status_message,
    runs.c.deployment_num,
    runs.c.priority,
    runs.c.run_spec,
    runs.c.service_templates,
).where(sa.text(SERVICE_RUN_SQL), runs.c.status.in_(LIVE), runs.c.deleted == sa.false())


async def live_services(conn: AsyncConnection) -> list[ServiceState]:
    rows = (await conn.execute(LIVE_SERVICES)).all()
    if not rows:
        return []
    by_run: dict[str, list[JobView]] = {r.id: [] for r in rows}
    job_rows = await conn.execute(
        sa.select(
            jobs.c.id,
            jobs.c.run_id,
            jobs.c.replica_num,
            jobs.c.submission_num,
            jobs.c.deployment_num,
            jobs.c.status,
            jobs.c.termination_reason,
            jobs.c.termination_reason_message,
            jobs.c.status_message,
            jobs.c.ready,
            jobs.c.drain_at,
            jobs.c.instance_id,
            jobs.c.stop_requested,
            jobs.c.submitted_at,
            jobs.c.finished_at,
            jobs.c.job_spec,
        ).where(jobs.c.run_id.in_(list(by_run)))
    )
    for j in job_rows:
        by_run[j.run_id].append(
            JobView(
                j.id,
                j.replica_num,
                j.submission_num,
                j.deployment_num,
                j.status,
                j.termination_reason,
                j.termination_reason_message,
                j.status_message,
                j.ready,
                j.drain_at,
                j.instance_id,
                j.stop_requested,
                j.submitted_at,
                j.finished_at,
                j.job_spec,
            )
        )
    out = []
    for r in rows:
        spec = orjson.loads(r.run_spec) or {}
        out.append(
            ServiceState(
                run_id=r.id,
                project_id=r.project_id,
                run_name=r.run_name,
                status=r.status,
                status_message=r.status_message,
                deployment_num=r.deployment_num,
                priority=r.priority,
                configuration=spec.get("configuration") or {},
                templates=orjson.loads(r.service_templates),
                jobs=tuple(by_run[r.id]),
            )
        )
    return out


async def requests_since(conn: AsyncConnection, run_ids: Sequence[str], since: int) -> dict[str, int]:
    """The requests counted for each service from second ``since`` on, by every server replica."""
    if not run_ids:
        return {}
    q = (
        sa.select(service_request_stats.c.run_id, sa.func.sum(service_request_stats.c.requests))
        .where(service_request_stats.c.run_id.in_(list(run_ids)), service_request_stats.c.second >= since)
        .group_by(service_request_stats.c.run_id)
    )
    return {row[0]: int(row[1] or 0) for row in await conn.execute(q)}


async def record_requests(conn: AsyncConnection, server: str, counts: Iterable[tuple[str, int, int]]) -> None:
    """One row per (service, second) this server counted: ``(run_id, second, requests)``; a second
    written twice (a flush retried) is added up."""
    rows = list(counts)
    if not rows:
        return
    for run_id, second, n in rows:
        updated = await conn.execute(
            sa.update(service_request_stats)
            .where(
                service_request_stats.c.run_id == run_id,
                service_request_stats.c.server == server,
                service_request_stats.c.second == second,
            )
            .values(requests=service_request_stats.c.requests + n)
        )
        if updated.rowcount == 0:
            await conn.execute(
                sa.insert(service_request_stats).values(run_id=run_id, server=server, second=second, requests=n)
            )


async def prune_requests(conn: AsyncConnection, before: int) -> None:
    await conn.execute(sa.delete(service_request_stats).where(service_request_stats.c.second < before))


async def add_replicas(
    conn: AsyncConnection, svc: ServiceState, template: Mapping[str, Any], numbers: Sequence[int], now: float
) -> list[str]:
    """New submissions of replicas ``numbers`` from ``template`` (the next ``submission_num`` of a number
    used before). The unique index on (run, replica, job, submission) makes a concurrent twin fail."""
    base = orjson.loads(template["job_spec"])
    previous: dict[int, int] = {}
    for j in svc.jobs:
        previous[j.replica_num] = max(previous.get(j.replica_num, -1), j.submission_num)
    values = []
    for n in numbers:
        spec = {**base, "replica_num": n, "job_name": f"{svc.run_name}-0-{n}"}
        values.append(
            {
                "id": str(uuid.uuid4()),
                "run_id": svc.run_id,
                "project_id": svc.project_id,
                "run_name": svc.run_name,
                "job_num": 0,
                "replica_num": n,
                "job_name": spec["job_name"],
                "submission_num": previous.get(n, -1) + 1,
                "deployment_num": svc.deployment_num,
                "submitted_at": now,
                "last_processed_at": now,
                "status": "submitted",
                "job_spec": orjson.dumps(spec).decode(),
                "scheduling_facts": template.get("scheduling_facts"),  # (none in older templates: derived when queued)
                "priority": svc.priority,
                "blocks": 1,
                "log_offset": 0,
                "ready": False,
            }
        )
    if values:
        await conn.execute(sa.insert(jobs), values)
        for v in values:
            target = job_target(svc.project_id, v["id"], v["job_name"], svc.run_id)
            await emit(conn, "Job created on scaling. Status: SUBMITTED", None, [target])
        await conn.execute(sa.update(runs).where(runs.c.id == svc.run_id).values(fleet_id=None, last_processed_at=now))
    return [v["id"] for v in values]


async def bump(conn: AsyncConnection, job_ids: Sequence[str], deployment_num: int) -> None:
    if job_ids:
        await conn.execute(sa.update(jobs).where(jobs.c.id.in_(list(job_ids))).values(deployment_num=deployment_num))


async def drain(conn: AsyncConnection, job_ids: Sequence[str], now: float) -> None:
    if job_ids:
        await conn.execute(
            sa.update(jobs).where(jobs.c.id.in_(list(job_ids)), jobs.c.drain_at.is_(None)).values(drain_at=now)
        )


async def scale_down(conn: AsyncConnection, views: Sequence[JobView], now: float) -> None:
    """Stop replicas ``scaled_down``: one never placed ends at once; the others are asked to stop."""
    for j in views:
        if j.status == "submitted" and j.instance_id is None:
            await tracked_update(
                conn,
                jobs,
                sa.and_(jobs.c.id == j.id, jobs.c.status == "submitted", jobs.c.instance_id.is_(None)),
                {
                    "status": "terminated",
                    "termination_reason": "scaled_down",
                    "finished_at": now,
                    "last_processed_at": now,
                },
            )
        elif j.status in FINISHED_JOB:
            # already ended: marked so that it is not submitted again (workers/service_health)
            await conn.execute(sa.update(jobs).where(jobs.c.id == j.id).values(stop_requested="scaled_down"))
        elif j.stop_requested is None:
            await conn.execute(
                sa.update(jobs)
                .where(jobs.c.id == j.id, jobs.c.stop_requested.is_(None))
                .values(stop_requested="scaled_down", drain_at=sa.func.coalesce(jobs.c.drain_at, now))
            )


async def set_message(conn: AsyncConnection, run_id: str, message: str | None) -> None:
    await conn.execute(sa.update(runs).where(runs.c.id == run_id).values(status_message=message))
