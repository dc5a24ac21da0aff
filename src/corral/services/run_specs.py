"""Run specs from requests: ``normalize`` validates a request's run spec (422s naming the field, dstack's name
rule, the server's caps) and parses its configuration and profile once into a typed
:class:`corral.config.run_spec.RunSpec` (``read`` there types a stored one).

May import ``domain``, ``config``, ``services.errors`` and ``services.input_rules``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral import config  # lazy: the models load on first use, not at start-up
from corral.config.run_spec import CONFIGURATION, RunSpec
from corral.domain.records import UserRec
from corral.services import input_rules
from corral.services.errors import InvalidConfiguration, ServiceError, validated

if TYPE_CHECKING:
    from corral.settings import Settings


def normalize(raw: object, loc: tuple[str | int, ...], user: UserRec, settings: Settings) -> RunSpec:
    """The run spec of a request validated (422 naming the field; dstack's name rule; the server's caps) and
    normalised: the configuration and profile parsed once."""
    if not isinstance(raw, dict):
        raise InvalidConfiguration(
            [{"type": "dict_type", "loc": ["body", *loc], "msg": "Input should be a valid dictionary"}]
        )
    conf = validated(config.parse_run_configuration, raw.get(CONFIGURATION), (*loc, CONFIGURATION))
    profile = validated(config.parse_profile, raw.get("profile"), (*loc, "profile"))
    input_rules.check_run_caps(conf, settings, (*loc, CONFIGURATION))
    if raw.get("run_name") is not None:
        input_rules.check_resource_name(raw["run_name"])
    elif conf.name is not None:
        input_rules.check_resource_name(conf.name)
    merged = config.effective_profile(profile, conf)
    document = {
        "run_name": raw.get("run_name") or conf.name,
        "repo_id": raw.get("repo_id") or "none",
        "repo_data": raw.get("repo_data") or {"repo_type": "virtual"},
        "repo_code_hash": raw.get("repo_code_hash"),
        "repo_dir": raw.get("repo_dir"),
        "file_archives": raw.get("file_archives") or [],
        "working_dir": raw.get("working_dir"),
        "configuration_path": raw.get("configuration_path"),
        CONFIGURATION: conf.model_dump(mode="json"),
        "profile": profile.model_dump(mode="json"),
        "ssh_key_pub": raw.get("ssh_key_pub") or user.ssh_public_key,
    }
    spec = RunSpec(conf=conf, profile=profile, merged=merged, document=document)
    if merged.instances and len(merged.instances) < spec.nodes:
        raise ServiceError(
            f"`instances` specifies {len(merged.instances)} instance(s) but the run requires {spec.nodes} nodes"
        )
    return spec


__all__ = ["normalize"]
