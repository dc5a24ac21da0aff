"""The normalized run spec: a run's configuration and profile parsed once (``normalize`` for a request,
``read`` for a stored document), the profile that applies (the configuration's own values over the
profile's), and the document dstack's API shows and the store keeps (its ``configuration`` is the typed
configuration's JSON, so both say the same).

The services and the scheduler read the typed values; only the wire and the store read ``document``.
May import ``domain``, ``config``, ``services.errors`` and ``services.input_rules``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from corral import config  # lazy: the models load on first use, not at start-up
from corral.domain.documents import run_configuration
from corral.domain.records import UserRec
from corral.services import input_rules
from corral.services.errors import InvalidConfiguration, ServiceError, validation_errors

if TYPE_CHECKING:
    from corral.config import AnyRunConfiguration, Profile, ProfileParams
    from corral.settings import Settings

#: The key of a run spec document that holds its configuration.
_CONFIGURATION = "configuration"


@dataclass(frozen=True)
class RunSpec:
    """One run spec, typed. ``document`` is dstack's ``RunSpec`` as answered and stored (never mutated: a
    new name gives a new value, ``named``)."""

    conf: AnyRunConfiguration
    profile: Profile
    #: The profile parameters that apply (``config.effective_profile``).
    merged: ProfileParams
    document: Mapping[str, Any]

    @property
    def run_name(self) -> str | None:
        name = self.document.get("run_name")
        return None if name is None else str(name)

    @property
    def configuration(self) -> dict[str, Any]:
        """The configuration as JSON (what ``document`` holds): for readers of stored-shaped documents."""
        out: dict[str, Any] = self.document[_CONFIGURATION]
        return out

    @property
    def nodes(self) -> int:
        """How many nodes (jobs per replica) a run of this configuration has."""
        return int(self.conf.nodes_num) if self.conf.type == "task" else 1

    @property
    def priority(self) -> int:
        return int(self.conf.priority or 0)

    def named(self, run_name: str) -> RunSpec:
        return dataclasses.replace(self, document={**self.document, "run_name": run_name})

    def as_dict(self) -> dict[str, Any]:
        """A copy of ``document`` (for the store and the answer)."""
        return dict(self.document)

    def same_configuration(self, stored: Mapping[str, Any]) -> bool:
        """Whether the stored run spec document ``stored`` has this configuration."""
        return run_configuration(stored) == self.configuration


def stored_type(stored: Mapping[str, Any]) -> str | None:
    """The run type a stored run spec document names (None where it names none)."""
    kind = run_configuration(stored).get("type")
    return None if kind is None else str(kind)


def normalize(raw: object, loc: tuple[str | int, ...], user: UserRec, settings: Settings) -> RunSpec:
    """The run spec of a request validated (422 naming the field; dstack's name rule; the server's caps) and
    normalised: the configuration and profile parsed once."""
    if not isinstance(raw, dict):
        raise InvalidConfiguration(
            [{"type": "dict_type", "loc": ["body", *loc], "msg": "Input should be a valid dictionary"}]
        )
    try:
        conf = config.parse_run_configuration(raw.get(_CONFIGURATION))
    except ValidationError as e:
        raise validation_errors(e, (*loc, _CONFIGURATION)) from None
    try:
        profile = config.parse_profile(raw.get("profile"))
    except ValidationError as e:
        raise validation_errors(e, (*loc, "profile")) from None
    input_rules.check_run_caps(conf, settings, (*loc, _CONFIGURATION))
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
        _CONFIGURATION: conf.model_dump(mode="json"),
        "profile": profile.model_dump(mode="json"),
        "ssh_key_pub": raw.get("ssh_key_pub") or user.ssh_public_key,
    }
    spec = RunSpec(conf=conf, profile=profile, merged=merged, document=document)
    if merged.instances and len(merged.instances) < spec.nodes:
        raise ServiceError(
            f"`instances` specifies {len(merged.instances)} instance(s) but the run requires {spec.nodes} nodes"
        )
    return spec


def read(document: Mapping[str, Any]) -> RunSpec:
    """A stored run spec document (written by ``normalize``, of this version or an older one), typed; raises
    pydantic's ``ValidationError`` or ``KeyError`` for one that cannot be read."""
    conf = config.parse_run_configuration(document[_CONFIGURATION])
    profile = config.parse_profile(document.get("profile"))
    return RunSpec(conf=conf, profile=profile, merged=config.effective_profile(profile, conf), document=document)


__all__ = ["RunSpec", "normalize", "read", "stored_type"]
