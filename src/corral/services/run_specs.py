"""Run specs from requests: ``normalize`` validates a request's run spec (422s naming the field, dstack's name
rule, the server's caps) and parses its configuration and profile once into a typed
:class:`corral.config.run_spec.RunSpec` (``read`` there types a stored one).

May import ``domain``, ``config``, ``schemas``, ``services.errors`` and ``services.input_rules``.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from corral import config  # lazy: the models load on first use, not at start-up
from corral.config.run_spec import CONFIGURATION, RunSpec
from corral.domain.records import UserRec
from corral.schemas.requests import RunSpecIn
from corral.services import input_rules
from corral.services.errors import ServiceError, validated

if TYPE_CHECKING:
    from corral.settings import Settings


def normalize(raw: RunSpecIn, loc: tuple[str | int, ...], user: UserRec, settings: Settings) -> RunSpec:
    """The run spec of a request validated (422 naming the field; dstack's name rule; the server's caps) and
    normalised: the configuration and profile parsed once."""
    least = settings.utilization_min_window  # None: dstack's 5 minutes
    parse_conf = partial(config.parse_run_configuration, utilization_min_window=least)
    conf = validated(parse_conf, raw.configuration, (*loc, CONFIGURATION))
    profile = validated(partial(config.parse_profile, utilization_min_window=least), raw.profile, (*loc, "profile"))
    input_rules.check_run_caps(conf, settings, (*loc, CONFIGURATION))
    if raw.run_name is not None:
        input_rules.check_resource_name(raw.run_name)
    elif conf.name is not None:
        input_rules.check_resource_name(conf.name)
    merged = config.effective_profile(profile, conf)
    document = {
        "run_name": raw.run_name or conf.name,
        "repo_id": raw.repo_id or "none",
        "repo_data": raw.repo_data or {"repo_type": "virtual"},
        "repo_code_hash": raw.repo_code_hash,
        "repo_dir": raw.repo_dir,
        "file_archives": raw.file_archives or [],
        "working_dir": raw.working_dir,
        "configuration_path": raw.configuration_path,
        CONFIGURATION: conf.model_dump(mode="json"),
        "profile": profile.model_dump(mode="json"),
        "ssh_key_pub": raw.ssh_key_pub or user.ssh_public_key,
    }
    spec = RunSpec(conf=conf, profile=profile, merged=merged, document=document)
    if merged.instances and len(merged.instances) < spec.nodes:
        raise ServiceError(
            f"`instances` specifies {len(merged.instances)} instance(s) but the run requires {spec.nodes} nodes"
        )
    return spec


def from_document(raw: Mapping[str, Any], loc: tuple[str | int, ...]) -> RunSpecIn:
    """A run spec document of a body that keeps it loose (``gpus/list``: dstack's whole ``RunSpec``, whatever
    its client's version adds) as the request model: the fields corral reads, checked (422 naming ``loc``)."""
    known = {k: v for k, v in raw.items() if k in RunSpecIn.model_fields}
    return validated(RunSpecIn.model_validate, known, loc)


__all__ = ["from_document", "normalize"]
