"""A job as the scheduler sees it (``QueuedJob``), from its scheduling facts (``domain.job_facts``: derived
once when it was written, or from its run's spec and its own job spec for a job stored without them): for the
scheduling worker's queue and for a plan's verdict (``services.plan_verdict``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from corral.config.job_facts import derive
from corral.config.run_spec import read
from corral.domain.job_facts import JobFacts
from corral.domain.volumes import VolumeRec, placements, where_volumes
from corral.scheduler import offer_filters
from corral.scheduler.types import QueuedJob, WaitPolicy

if TYPE_CHECKING:
    from corral.config.run_spec import RunSpec


def stored_facts(run_spec: Mapping[str, Any] | None, job_spec: Mapping[str, Any] | None) -> JobFacts:
    """The scheduling facts of a job stored without them, from its run's stored spec and its own (raises
    ``ValueError``, pydantic's ``ValidationError`` or ``KeyError`` for documents that cannot be read)."""
    if run_spec is None or job_spec is None:
        raise ValueError("the job's documents were not loaded")
    return derive(read(run_spec), job_spec)


def wait_policy(facts: JobFacts, replica_num: int, submitted_at: float, server_max: float | None) -> WaitPolicy:
    """How long the job may wait for capacity. A service's replicas after the first wait whatever its ``retry``
    says: one replica without room must not fail the service its others serve (the service's own clock,
    ``retry.duration`` with no replica ready, ends it; ``workers.service_health``)."""
    if facts.run_type == "service" and replica_num > 0:
        return WaitPolicy(True, None)
    if not facts.wait.waits:
        return WaitPolicy(False)
    return WaitPolicy(True, facts.wait.deadline(submitted_at, server_max))


def from_facts(
    facts: JobFacts,
    *,
    id: str,
    run_id: str,
    project_id: str,
    project_name: str,
    run_name: str,
    job_num: int,
    replica_num: int,
    priority: int,
    submitted_at: float,
    max_queue_wait: float | None,
    barred_backends: frozenset[str] = frozenset(),
    volume_places: Mapping[tuple[str, str], VolumeRec] | None = None,
) -> QueuedJob:
    """A job as the scheduler sees it, from its scheduling facts (no configuration is parsed here)."""
    job_filter = offer_filters.from_options(
        facts.backends, facts.regions, facts.instance_types, facts.max_price, facts.spot_policy
    )
    backends, regions, zones, volumes_where = job_filter.backends, job_filter.regions, None, ""
    if facts.volumes:  # placement follows the volumes: their backend, region and zone (one of each mount point)
        places = volume_places or {}
        missing = [n for names in facts.volumes for n in names if (project_id, n) not in places]
        if missing:
            raise ValueError(f"volume {', '.join(missing)} not found (deleted since the run was submitted?)")
        points = [[places[(project_id, n)] for n in names] for names in facts.volumes]
        where = placements(points)
        volumes_where = where_volumes(v for alts in points for v in alts)
        backends, regions = frozenset(p[0] for p in where), frozenset(p[1] for p in where)
        zones = None if any(p[2] is None for p in where) else frozenset(str(p[2]) for p in where)
    return QueuedJob(
        id=id,
        run_id=run_id,
        project_id=project_id,
        run_name=run_name,
        job_num=job_num,
        priority=priority,
        submitted_at=submitted_at,
        requirements=facts.requirements,
        fleet_names=facts.fleet_names,
        creation_policy=facts.creation_policy,
        wait=wait_policy(facts, replica_num, submitted_at, max_queue_wait),
        nodes=facts.nodes,
        multinode=facts.nodes > 1,
        project_name=project_name,
        selectors=facts.selectors,
        barred_backends=barred_backends,
        backends=backends,
        max_price=job_filter.max_price,
        regions=regions,
        zones=zones,
        volumes_where=volumes_where,
        instance_types=job_filter.instance_types,
        spot=job_filter.spot,
        replica_num=replica_num,
        reservation=facts.reservation,
    )


def queued_job(
    spec: RunSpec,
    job_spec: Mapping[str, Any],
    *,
    id: str,
    run_id: str,
    project_id: str,
    project_name: str,
    run_name: str,
    job_num: int,
    priority: int,
    submitted_at: float,
    max_queue_wait: float | None,
    barred_backends: frozenset[str] = frozenset(),
    volume_places: Mapping[tuple[str, str], VolumeRec] | None = None,
) -> QueuedJob:
    """A job as the scheduler sees it, from its run's spec (typed) and its own job spec (a plan's first job)."""
    return from_facts(
        derive(spec, job_spec),
        id=id,
        run_id=run_id,
        project_id=project_id,
        project_name=project_name,
        run_name=run_name,
        job_num=job_num,
        replica_num=int(job_spec.get("replica_num") or 0),
        priority=priority,
        submitted_at=submitted_at,
        max_queue_wait=max_queue_wait,
        barred_backends=barred_backends,
        volume_places=volume_places,
    )
