"""What a request may ask for beyond its grammar: dstack's name rules and the server's caps on sizes.

* names: runs, fleets, volumes, gateways and exports follow dstack's resource-name rule (its message, a 400),
  checked wherever a name enters (``apply``, ``get_plan``, exports), generated names included;
* caps (``Settings.max_nodes``, ``max_replicas``): far above what dstack's configurations ask for, so that
  one request cannot make the server build an answer of millions of jobs; a refusal is a 422 naming the
  field and the setting that raises it.

May import ``domain`` and ``services.errors``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corral.domain.names import resource_name_error
from corral.services.errors import InvalidConfiguration, ServiceError

if TYPE_CHECKING:
    from corral.config import AnyRunConfiguration


def check_resource_name(name: object) -> None:
    """dstack's ``validate_dstack_resource_name``: a 400 with its message."""
    bad = resource_name_error(name)
    if bad is not None:
        raise ServiceError(bad)


def _over(loc: tuple[str | int, ...], value: int, cap: int, var: str) -> InvalidConfiguration:
    return InvalidConfiguration(
        [
            {
                "type": "less_than_equal",
                "loc": ["body", *loc],
                "msg": f"Input should be less than or equal to {cap} (the server's {var})",
                "input": value,
            }
        ]
    )


def check_run_caps(conf: AnyRunConfiguration, settings: Any, loc: tuple[str | int, ...]) -> None:
    """A task's ``nodes`` (and its groups' ``nodes``, together) and a service's ``replicas`` within the caps."""
    if conf.type == "task":
        groups = getattr(conf, "groups", None) or []
        for i, group in enumerate(groups):
            if group.nodes > settings.max_nodes:
                raise _over((*loc, "groups", i, "nodes"), group.nodes, settings.max_nodes, "CORRAL_MAX_NODES")
        total = conf.nodes_num
        if total > settings.max_nodes:
            where = (*loc, "groups") if groups else (*loc, "nodes")
            raise _over(where, total, settings.max_nodes, "CORRAL_MAX_NODES")
    elif conf.type == "service":
        total = 0
        for i, group in enumerate(conf.replica_groups):
            top = max(group.replicas.min or 0, group.replicas.max or 0)
            where = (*loc, "replicas", i, "replicas") if conf.groups is not None else (*loc, "replicas")
            if top > settings.max_replicas:
                raise _over(where, top, settings.max_replicas, "CORRAL_MAX_REPLICAS")
            total += top
        if total > settings.max_replicas:
            raise _over((*loc, "replicas"), total, settings.max_replicas, "CORRAL_MAX_REPLICAS")


def check_fleet_caps(conf: dict[str, Any], settings: Any, loc: tuple[str | int, ...]) -> None:
    """Every bound a fleet's ``nodes`` gives (``min``, ``target``, ``max``) within ``max_nodes``."""
    nodes = conf.get("nodes")
    if isinstance(nodes, int):
        nodes = {"min": nodes}
    if not isinstance(nodes, dict):
        return
    for key in ("min", "target", "max"):
        value = nodes.get(key)
        if isinstance(value, int) and value > settings.max_nodes:
            raise _over((*loc, "nodes", key), value, settings.max_nodes, "CORRAL_MAX_NODES")
