"""A fleet spec, typed: dstack's ``FleetSpec`` document (as the API answers it and the store keeps it) with
its configuration and profile parsed once. ``read`` types a stored document; ``services.fleets.normalize_spec``
makes one from a request.

Every layer may hold a ``FleetSpec``: it is a value of the configuration's. May import: corral.domain,
pydantic (through the configuration models).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral import config  # lazy: the models load on first use, not at start-up
from corral.domain.documents import spec_configuration

if TYPE_CHECKING:
    from corral.config import FleetConfiguration, Profile

#: The key of a fleet spec document that holds its configuration.
CONFIGURATION = "configuration"


@dataclass(frozen=True)
class FleetSpec:
    """One fleet spec, typed. ``document`` is dstack's ``FleetSpec`` as answered and stored (never mutated:
    a new name gives a new value, ``named``)."""

    conf: FleetConfiguration
    profile: Profile
    document: Mapping[str, Any]

    @property
    def name(self) -> str | None:
        return self.conf.name

    @property
    def is_ssh(self) -> bool:
        return self.conf.ssh_config is not None

    @property
    def configuration(self) -> dict[str, Any]:
        """The configuration as JSON (what ``document`` holds): for readers of stored-shaped documents."""
        out: dict[str, Any] = self.document[CONFIGURATION]
        return out

    def named(self, name: str) -> FleetSpec:
        """This spec with the fleet's name set (in place of the same key: the document's order is kept)."""
        return dataclasses.replace(
            self,
            conf=self.conf.model_copy(update={"name": name}),
            document={**self.document, CONFIGURATION: {**self.configuration, "name": name}},
        )

    def as_dict(self) -> dict[str, Any]:
        """A copy of ``document`` (for the store and the answer)."""
        return dict(self.document)


def is_ssh(stored: Mapping[str, Any]) -> bool:
    """Whether a stored fleet spec document configures an SSH fleet (no parsing: for hot paths)."""
    return bool(spec_configuration(stored).get("ssh_config"))


def read(document: Mapping[str, Any]) -> FleetSpec:
    """A stored fleet spec document (written by ``services.fleets.normalize_spec``), typed; raises
    pydantic's ``ValidationError`` or ``KeyError`` for one that cannot be read."""
    conf = config.parse_fleet_configuration(document[CONFIGURATION])
    return FleetSpec(conf=conf, profile=config.parse_profile(document.get("profile")), document=document)


__all__ = ["CONFIGURATION", "FleetSpec", "is_ssh", "read"]
