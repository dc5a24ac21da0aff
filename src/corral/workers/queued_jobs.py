"""A job as the scheduler sees it (``QueuedJob``), from its run's spec (``config.run_spec``) and its own
stored job spec: for the scheduling worker's queue and for a plan's verdict (``services.plan_verdict``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from corral import config  # lazy: the models load on first use, not at start-up
from corral.domain.selectors import FleetRef, Selector
from corral.domain.volumes import VolumeRec, placement, volume_names
from corral.scheduler import offer_filters
from corral.scheduler.types import QueuedJob, WaitPolicy

if TYPE_CHECKING:
    from corral.config import AnyRunConfiguration
    from corral.config.run_spec import RunSpec

DEFAULT_RETRY_DURATION = 3600.0


def wait_policy(retry: Any, submitted_at: float, server_max: float | None) -> WaitPolicy:
    """How long a job may wait for capacity, from its ``retry`` (docs/dev/architecture.md, queue semantics)."""
    if retry is None:
        return WaitPolicy(True, None if server_max is None else submitted_at + server_max)
    if retry is False:
        return WaitPolicy(False)
    if retry is True:
        return WaitPolicy(True, submitted_at + DEFAULT_RETRY_DURATION)
    events = getattr(retry, "on_events", None)
    if events is not None and "no-capacity" not in {getattr(e, "value", e) for e in events}:
        return WaitPolicy(False)
    duration = getattr(retry, "duration", None)
    return WaitPolicy(True, submitted_at + float(duration if duration is not None else DEFAULT_RETRY_DURATION))


def _service_replica_wait(conf: AnyRunConfiguration, job_spec: Mapping[str, Any]) -> WaitPolicy | None:
    """A service's replicas after the first wait for capacity whatever its ``retry`` says: one replica
    without room must not fail the service its others serve (the service's own clock, ``retry.duration``
    with no replica ready, ends it; ``workers.service_health``)."""
    if conf.type == "service" and int(job_spec.get("replica_num") or 0) > 0:
        return WaitPolicy(True, None)
    return None


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
    """A job as the scheduler sees it, from its run's spec (typed) and its own stored job spec."""
    conf, profile = spec.conf, spec.merged
    resources = config.ResourcesSpec.model_validate(job_spec["requirements"]["resources"])
    fleets = None
    if profile.fleets is not None:
        fleets = tuple(f.format() if hasattr(f, "format") else str(f) for f in profile.fleets)
    nodes = spec.nodes
    selectors = None if profile.instances is None else tuple(to_selector(x) for x in profile.instances)
    job_filter = offer_filters.run_filter(profile)
    backends, regions, zones = job_filter.backends, job_filter.regions, None
    names = volume_names(spec.configuration)
    if names:  # placement follows the volumes: their backend, region and zone
        places = volume_places or {}
        missing = [n for n in names if (project_id, n) not in places]
        if missing:
            raise ValueError(f"volume {', '.join(missing)} not found (deleted since the run was submitted?)")
        backend, region, zone = placement([places[(project_id, n)] for n in names])
        backends, regions = frozenset({backend}), frozenset({region.lower()})
        zones = frozenset({zone}) if zone else None
    return QueuedJob(
        id=id,
        run_id=run_id,
        project_id=project_id,
        run_name=run_name,
        job_num=job_num,
        priority=priority,
        submitted_at=submitted_at,
        requirements=resources.to_requirements(),
        fleet_names=fleets,
        creation_policy=getattr(profile.creation_policy, "value", str(profile.creation_policy)),
        wait=_service_replica_wait(conf, job_spec) or wait_policy(profile.retry, submitted_at, max_queue_wait),
        nodes=nodes,
        multinode=nodes > 1,
        project_name=project_name,
        selectors=selectors,
        barred_backends=barred_backends,
        backends=backends,
        max_price=job_filter.max_price,
        regions=regions,
        zones=zones,
        instance_types=job_filter.instance_types,
        spot=job_filter.spot,
        replica_num=int(job_spec.get("replica_num") or 0),
        reservation=str(profile.reservation) if profile.reservation else None,
    )


def to_selector(sel: Any) -> Selector:
    """A configuration selector (``config.profiles``) as the scheduler's pure value."""
    if getattr(sel, "name", None) is not None and not hasattr(sel, "instance"):
        return Selector(name=sel.name)
    if getattr(sel, "hostname", None) is not None:
        return Selector(hostname=sel.hostname)
    fleet = sel.fleet
    return Selector(fleet=FleetRef(fleet.name, fleet.project), instance_num=int(sel.instance))
