"""The ``instances`` option: selectors that pin a run to existing fleet instances (pure).

A selector matches an instance by its name; by hostname or IP (the instance's hostname, public or
internal IP, or an SSH host's address), case-insensitively; or by fleet plus instance number, where the
fleet may be qualified with its project. Allow-list semantics: a run with selectors is only ever placed on
matching existing instances, never on new ones.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FleetRef:
    name: str
    project: str | None = None

    def matches(self, fleet_name: str, fleet_project: str, run_project: str) -> bool:
        if fleet_name.lower() != self.name.lower():
            return False
        wanted = self.project if self.project is not None else run_project
        return fleet_project.lower() == wanted.lower()

    def __str__(self) -> str:
        return self.name if self.project is None else f"{self.project}/{self.name}"


@dataclass(frozen=True)
class Selector:
    """One entry of ``instances``: exactly one of ``name``, ``hostname`` or ``fleet`` + ``instance_num``."""

    name: str | None = None
    hostname: str | None = None
    fleet: FleetRef | None = None
    instance_num: int | None = None

    def __str__(self) -> str:
        if self.name is not None:
            return f"name: {self.name}"
        if self.hostname is not None:
            return f"hostname: {self.hostname}"
        return f"fleet: {self.fleet}, instance: {self.instance_num}"


@dataclass(frozen=True)
class InstanceIdentity:
    """What selectors can see of an instance."""

    name: str
    instance_num: int
    fleet_name: str
    project_name: str
    addresses: tuple[str, ...] = ()


def matches(selector: Selector, inst: InstanceIdentity, run_project: str) -> bool:
    if selector.name is not None:
        return inst.name == selector.name
    if selector.hostname is not None:
        wanted = selector.hostname.lower()
        return any(a.lower() == wanted for a in inst.addresses)
    if selector.fleet is not None:
        return inst.instance_num == selector.instance_num and selector.fleet.matches(
            inst.fleet_name, inst.project_name, run_project
        )
    return False
