"""A run spec, typed: dstack's ``RunSpec`` document (as the API answers it and the store keeps it) with its
configuration and profile parsed once, and the profile that applies (the configuration's own values over the
profile's). ``read`` types a stored document; ``services.run_specs.normalize`` makes one from a request.

Every layer may hold a ``RunSpec`` (the services, the scheduling worker, the serializers): it is a value of the
configuration's. May import: corral.domain, pydantic (through the configuration models).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral import config  # lazy: the models load on first use, not at start-up
from corral.domain.documents import spec_configuration

if TYPE_CHECKING:
    from corral.config import AnyRunConfiguration, Profile, ProfileParams

#: The key of a run spec document that holds its configuration.
CONFIGURATION = "configuration"


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
        out: dict[str, Any] = self.document[CONFIGURATION]
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
        return spec_configuration(stored) == self.configuration


def stored_type(stored: Mapping[str, Any]) -> str | None:
    """The run type a stored run spec document names (None where it names none)."""
    kind = spec_configuration(stored).get("type")
    return None if kind is None else str(kind)


def read(document: Mapping[str, Any]) -> RunSpec:
    """A stored run spec document (written by ``services.run_specs.normalize``, of this version or an older
    one), typed; raises pydantic's ``ValidationError`` or ``KeyError`` for one that cannot be read."""
    # checked when it was submitted, under the server's minimum window then: read as it was accepted
    conf = config.parse_run_configuration(document[CONFIGURATION], utilization_min_window=0)
    profile = config.parse_profile(document.get("profile"), utilization_min_window=0)
    return RunSpec(conf=conf, profile=profile, merged=config.effective_profile(profile, conf), document=document)


__all__ = ["CONFIGURATION", "RunSpec", "read", "stored_type"]
