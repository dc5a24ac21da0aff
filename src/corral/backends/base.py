"""The ``Compute`` protocol every backend implements, and what it hands back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from corral.domain.resources import InstanceResources
from corral.scheduler.types import Offer


class ProvisioningError(Exception):
    """A backend could not create an instance; the message is shown to the user."""


@dataclass(frozen=True)
class AgentEndpoint:
    """How the server reaches an instance's agent (stored in the instance row's ``agent``)."""

    url: str
    token: str
    pid: int | None = None
    work_dir: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "token": self.token, "pid": self.pid, "work_dir": self.work_dir}

    @staticmethod
    def from_json(data: dict[str, Any]) -> AgentEndpoint:
        return AgentEndpoint(url=data["url"], token=data["token"], pid=data.get("pid"), work_dir=data.get("work_dir"))


@dataclass(frozen=True)
class Provisioned:
    agent: AgentEndpoint
    hostname: str
    resources: InstanceResources
    internal_ip: str | None = None


class Compute(Protocol):
    name: str

    def offers(self) -> list[Offer]: ...

    async def create_instance(self, instance_id: str, instance_name: str) -> Provisioned: ...

    async def terminate_instance(self, instance_id: str, agent: AgentEndpoint | None) -> None: ...

    async def reap_unknown(self, known_instance_ids: set[str]) -> list[str]: ...
