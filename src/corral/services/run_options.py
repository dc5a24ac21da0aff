"""Run options at submission: what corral refuses of dstack 0.22.5's run configuration and profile
(a 400 naming the field and the fix, never an option silently ignored), and ``schedule``'s start.

The option-by-option audit is the user guide's ``docs/reference/run-options.md``; this module holds
the refusals it lists. ``schedule`` is applied: the run is written ``pending`` with no jobs, its crons,
its first trigger (``corral.domain.cron``) and the jobs each trigger submits (``store/triggers.py``).
Pure but for the configuration models; imports ``domain``, ``services.errors`` and ``store.triggers``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from corral.domain.cron import never_firing, next_trigger
from corral.domain.node_groups import check_refs
from corral.services.errors import ServiceError
from corral.store.triggers import templates_dump

if TYPE_CHECKING:
    from corral.config import AnyRunConfiguration, ProfileParams, TaskConfiguration

#: Profile options that only shape the cloud instances provisioned for a run (dstack combines them with
#: the fleet's when it creates one): corral does not apply them to runs yet. (``regions`` and
#: ``instance_types`` are applied: ``scheduler.offer_filters``; ``reservation`` too: ``scheduler.fleet_view``.)
_PROVISIONING_ONLY = ("availability_zones", "tags", "backend_options")


def check(
    conf: AnyRunConfiguration,
    merged: ProfileParams,
    metrics_running_ttl: float | None = None,
    allow_docker: bool = True,
) -> None:
    """Raise ``ServiceError`` (400) for an option corral accepts in the grammar but does not apply, one
    out of bounds (``utilization_policy.time_window`` beyond the kept samples, ``metrics_running_ttl``), or
    ``docker: true`` where the server's admin turned it off (``allow_docker``)."""
    if conf.type == "task":
        _check_group_refs(conf)
    policy = merged.utilization_policy
    if policy is not None and metrics_running_ttl is not None and policy.time_window > metrics_running_ttl:
        raise ServiceError(f"Maximum utilization_policy.time_window is {int(metrics_running_ttl)}s")
    for field in _PROVISIONING_ONLY:
        if getattr(merged, field) is not None:
            raise ServiceError(
                f"`{field}` is not applied to runs yet: it only shapes new cloud instances, and corral provisions "
                f"runs on their fleets' instances; set it in the fleet configuration, or remove it from the run"
            )
    if conf.docker is True and not allow_docker:
        raise ServiceError(
            "`docker: true` is turned off on this server (CORRAL_ALLOW_DOCKER_IN_DOCKER=false): its job runs in "
            "a privileged container, which is not isolated from its host; remove `docker`, or ask the server's "
            "admin to allow it"
        )
    if conf.dstack:
        raise ServiceError("`dstack: true` (the server reachable from inside the run) is not supported yet; remove it")
    if merged.schedule is not None and conf.type == "service":
        raise ServiceError("`schedule`: scheduled services are not supported yet; schedule a task instead")


def _check_group_refs(conf: TaskConfiguration) -> None:
    """``${{ groups[i].nodes[j].IP_ADDRESS }}`` in a task's commands must name a node the run has."""
    groups = conf.groups or []
    sizes = [g.nodes for g in groups] if groups else [conf.nodes_num]
    places = [(f"groups[{i}] ({g.name}).commands", g.commands) for i, g in enumerate(groups)]
    for where, commands in places or [("commands", conf.commands)]:
        for command in commands:
            why = check_refs(command, sizes)
            if why is not None:
                raise ServiceError(f"`{where}`: {why}")


def schedule_crons(conf: AnyRunConfiguration, merged: ProfileParams, now: float) -> list[str] | None:
    """The crons of a scheduled run (None: not scheduled); refuses expressions that never fire."""
    if merged.schedule is None:
        return None
    crons = list(merged.schedule.crons)
    never = never_firing(crons, now)
    if never:
        raise ServiceError(
            f"`schedule.cron`: {', '.join(repr(c) for c in never)} never fire(s) (no such date); fix the day and month"
        )
    return crons


def scheduled_run_values(crons: Sequence[str], job_values: Sequence[dict[str, Any]], now: float) -> dict[str, Any]:
    """The run row's schedule columns: the crons, the first trigger and the jobs each trigger submits."""
    return {
        "schedule": orjson.dumps(list(crons)).decode(),
        "next_triggered_at": next_trigger(crons, now),
        "job_templates": templates_dump(job_values),
    }
