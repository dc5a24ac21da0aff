"""The ``Compute`` protocol every backend implements, and what it hands back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from corral.domain.records import InstanceRec
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
    #: Backend-specific facts needed to reach the host again (the SSH backend: host, port, user, key,
    #: proxy jump), kept from the instance's creation on; None for agents on this machine.
    connection: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"url": self.url, "token": self.token, "pid": self.pid, "work_dir": self.work_dir}
        if self.connection is not None:
            data["connection"] = self.connection
        return data

    def opened(self, open_token: Callable[[str], str]) -> AgentEndpoint:
        """This endpoint with its token in clear (an instance row stores it sealed)."""
        return replace(self, token=open_token(self.token))

    @staticmethod
    def from_json(data: dict[str, Any]) -> AgentEndpoint:
        """The endpoint as an instance row stores it (the token sealed: see :meth:`opened`)."""
        return AgentEndpoint(
            url=data.get("url") or "",
            token=data["token"],
            pid=data.get("pid"),
            work_dir=data.get("work_dir"),
            connection=data.get("connection"),
        )


@dataclass(frozen=True)
class Provisioned:
    agent: AgentEndpoint
    hostname: str
    resources: InstanceResources
    internal_ip: str | None = None
    #: The instance's blocks when only the host's resources decide them (``blocks: auto``).
    total_blocks: int | None = None
    #: Hostnames and IPs the host answers to (for ``instances`` hostname selectors).
    addresses: tuple[str, ...] = ()
    #: The offer launched when it is not the row's own (a cloud fell back on another type or region).
    offer: Offer | None = None


class Compute(Protocol):
    name: str

    def offers(self) -> list[Offer]: ...

    async def create_instance(self, instance: InstanceRec) -> Provisioned: ...

    async def terminate_instance(self, instance_id: str, agent: AgentEndpoint | None) -> None: ...

    async def reap_unknown(self, known_instance_ids: set[str]) -> list[str]: ...

    def agent_url(self, instance: InstanceRec) -> str:
        """Where this process reaches the agent of a provisioned ``instance`` now (for SSH hosts: a local
        end of a tunnel, set up again after a server restart)."""
        ...

    async def recover(self, instance: InstanceRec) -> None:
        """The agent of ``instance`` does not answer: bring it back if the host is there (a rebooted
        host without systemd, a killed agent). Raises when it cannot; a no-op where nothing can be done."""
        ...

    async def aclose(self) -> None:
        """Release connections and listeners at server shutdown (agents keep running)."""
        ...
