"""A job's scheduling facts (:class:`corral.domain.job_facts.JobFacts`) from its run's typed spec and its own
job spec: derived once when the job is written (``services.run_apply``), and again, once, by the scheduling
worker for a job stored without them (written by an older corral, or by a writer that does not derive them).

May import: corral.domain, the configuration models.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import orjson

from corral import config  # lazy: the models load on first use, not at start-up
from corral.config.run_spec import RunSpec
from corral.domain.job_facts import JobFacts, WaitRule
from corral.domain.resources import Requirements
from corral.domain.selectors import FleetRef, Selector
from corral.domain.volumes import mount_points

#: How long ``retry: true`` (or a ``retry`` without a ``duration``) waits for capacity.
DEFAULT_RETRY_DURATION = 3600.0


def wait_rule(retry: Any) -> WaitRule:
    """How long a job may wait for capacity, from its ``retry`` (docs/dev/architecture.md, queue semantics):
    no ``retry`` waits (bounded by the server's setting), ``false`` fails at once, ``true`` waits an hour,
    ``on_events`` without ``no-capacity`` fails at once, else it waits ``duration``."""
    if retry is None:
        return WaitRule(True, None, server_bound=True)
    if retry is False:
        return WaitRule(False)
    if retry is True:
        return WaitRule(True, DEFAULT_RETRY_DURATION)
    events = getattr(retry, "on_events", None)
    if events is not None and "no-capacity" not in {getattr(e, "value", e) for e in events}:
        return WaitRule(False)
    duration = getattr(retry, "duration", None)
    return WaitRule(True, float(duration if duration is not None else DEFAULT_RETRY_DURATION))


def to_selector(sel: Any) -> Selector:
    """A configuration selector (``config.profiles``) as the scheduler's pure value."""
    if getattr(sel, "name", None) is not None and not hasattr(sel, "instance"):
        return Selector(name=sel.name)
    if getattr(sel, "hostname", None) is not None:
        return Selector(hostname=sel.hostname)
    fleet = sel.fleet
    return Selector(fleet=FleetRef(fleet.name, fleet.project), instance_num=int(sel.instance))


def _words(values: Any) -> tuple[str, ...] | None:
    """A list option (enum members or strings) as strings; None stays None."""
    return None if values is None else tuple(str(getattr(v, "value", v)) for v in values)


@lru_cache(maxsize=256)
def _parsed_requirements(text: bytes) -> Requirements:
    """The requirements of a job spec's resources, given as their JSON text (sorted keys): most jobs a server
    writes share a few, and parsing them again costs more than the rest of the facts (an error is not kept)."""
    return _requirements(orjson.loads(text))


def _requirements(resources: Any) -> Requirements:
    return config.ResourcesSpec.model_validate(resources).to_requirements()


def requirements_of(resources: Any) -> Requirements:
    """A job spec's ``requirements.resources`` as the scheduler's requirements (raises pydantic's
    ``ValidationError`` where they cannot be read); parsed once per distinct value."""
    try:
        text = orjson.dumps(resources, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # not plain JSON values: parsed as they are, not kept
        return _requirements(resources)
    return _parsed_requirements(text)


def derive(spec: RunSpec, job_spec: Mapping[str, Any]) -> JobFacts:
    """The job's scheduling facts (raises pydantic's ``ValidationError`` or ``KeyError`` for a job spec
    whose resources cannot be read)."""
    profile = spec.merged
    requirements = requirements_of(job_spec["requirements"]["resources"])
    fleets = None
    if profile.fleets is not None:
        fleets = tuple(f.format() if hasattr(f, "format") else str(f) for f in profile.fleets)
    spot = profile.spot_policy
    return JobFacts(
        requirements=requirements,
        fleet_names=fleets,
        creation_policy=str(getattr(profile.creation_policy, "value", profile.creation_policy)),
        wait=wait_rule(profile.retry),
        nodes=spec.nodes,
        selectors=None if profile.instances is None else tuple(to_selector(x) for x in profile.instances),
        backends=_words(profile.backends),
        regions=_words(profile.regions),
        instance_types=_words(profile.instance_types),
        max_price=None if profile.max_price is None else float(profile.max_price),
        spot_policy=None if spot is None else str(getattr(spot, "value", spot)),
        reservation=str(profile.reservation) if profile.reservation else None,
        volumes=tuple(names for names, _path in mount_points(spec.configuration)),
        has_image=bool(spec.conf.image) or spec.conf.docker is True,  # docker: true runs in a container
        run_type=str(spec.conf.type),
    )


__all__ = ["DEFAULT_RETRY_DURATION", "derive", "requirements_of", "to_selector", "wait_rule"]
