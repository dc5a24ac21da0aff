"""The ``Compute`` protocol every backend implements, what it hands back, and the capabilities some backends
add to it.

A capability is a ``runtime_checkable`` Protocol: the code that needs one asks ``isinstance(compute, Capability)``
(never ``getattr`` or ``hasattr``), and mypy checks the implementers against it.

| capability | what it does | implemented by |
|---|---|---|
| :class:`GangLauncher` | launches a gang's instances together, all or none | ``aws``, ``slurm`` |
| :class:`InterruptionSource` | says which live instances the provider took away, forgets them | ``aws``, ``slurm`` |
| :class:`PortOpener` | opens a stream to a port on an instance's host (proxy, probes) | ``local``, ``ssh``, ``slurm`` |
| :class:`SharedHost` | carves its instances out of one host; says whether its jobs have a sandbox | ``local`` |
| :class:`GatewayProvisioner` | brings up and tears down a host for a gateway, and says its address | ``aws`` |
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeGuard, runtime_checkable

from corral.domain.provisioning import FailureKind
from corral.domain.records import InstanceRec
from corral.domain.resources import InstanceResources
from corral.scheduler.types import Offer


class ProvisioningError(Exception):
    """A backend could not create an instance; the message is shown to the user, and ``kind`` says why
    (``domain.provisioning``: no capacity unless the backend knows better)."""

    def __init__(self, message: str, kind: FailureKind = "no_capacity") -> None:
        super().__init__(message)
        self.kind: FailureKind = kind


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
    #: What the backend says of the instance (the instance's ``status_message``: a Slurm allocation's time limit).
    status_message: str | None = None


class Compute(Protocol):
    name: str
    #: The backend made its instances and can end and replace them (local agents, cloud VMs): one whose agent
    #: stays lost past the backend's bound is terminated (``workers/hosts.py``). False for hosts it was given
    #: (SSH fleets), which it can neither terminate nor replace.
    owns_hosts: bool

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


# --- capabilities: what some backends add to ``Compute`` -------------------------------------------------


@runtime_checkable
class GangLauncher(Protocol):
    """A backend that provisions a gang's instances (a multi-node task's cluster fleet) together, all or none
    (the aws backend: one placement group, ``workers.gangs``)."""

    async def create_gang(self, rows: list[InstanceRec], cluster: bool, reservation: str | None) -> list[Provisioned]:
        """Bring up every instance of ``rows`` (in their order), in one cluster placement when ``cluster``,
        in the capacity reservation ``reservation`` if one is named; raises and leaves none when any fails."""
        ...


class LostInstance(Protocol):
    """An instance the provider took away (a reclaimed spot instance, one terminated outside corral)."""

    @property
    def row_id(self) -> str:
        """The id of the instance's row."""
        ...

    @property
    def message(self) -> str:
        """Why it is gone, as the instance's and its jobs' termination message."""
        ...


@runtime_checkable
class InterruptionSource(Protocol):
    """A backend that can say which of its live instances the provider took away (``workers.interruptions``)."""

    async def lost_instances(self, live: list[InstanceRec]) -> Sequence[LostInstance]:
        """Those of ``live`` (idle or busy rows of this backend) that are going or gone."""
        ...

    async def forget(self, instance_id: str) -> None:
        """Drop what the server holds of a lost instance (its connection), once it is recorded lost; and end what
        the backend reported as about to go (Slurm: an allocation ended ahead of its time limit), so that its jobs
        end with the recorded reason."""
        ...


@runtime_checkable
class PortOpener(Protocol):
    """A backend that reaches a port on its instances' hosts (``backends.replica_port``: the proxy and the
    probes reach service replicas so)."""

    async def open_port(self, instance: InstanceRec, port: int) -> tuple[Any, Any]:
        """``(reader, writer)`` to ``port`` on ``instance``'s host; raises ``OSError`` when nothing answers."""
        ...


@runtime_checkable
class SharedHost(Protocol):
    """A backend whose instances are carved out of one host (the local backend: this machine)."""

    #: Why the host's agents run host-process jobs without a sandbox (their own network and mounts); None
    #: when they have one.
    sandbox_reason: str | None

    def host_blocks(self) -> int:
        """The host's blocks, shared by all the backend's instances."""
        ...


def is_shared_host(compute: object) -> TypeGuard[SharedHost]:
    """``isinstance(compute, SharedHost)``: whether it has the protocol's members, checked without the runtime
    protocol's own machinery (12 µs a call; every apply and scheduling pass asks)."""
    return hasattr(compute, "host_blocks") and hasattr(compute, "sandbox_reason")


def sandbox_reason(compute: Compute | None) -> str | None:
    """Why ``compute``'s jobs run without a sandbox: None when they have one, or when it is no shared host."""
    return compute.sandbox_reason if is_shared_host(compute) else None


@dataclass(frozen=True)
class GatewaySpec:
    """What a gateway's host must be (from the gateway's configuration)."""

    gateway_id: str
    project_name: str
    region: str | None = None
    #: The backend's default when None.
    instance_type: str | None = None
    #: False: a private gateway, reachable only inside the provider's network.
    public_ip: bool = True
    #: The gateway's name (in the host's display name).
    name: str = ""
    #: The configuration's ``tags``, put on what is made for the gateway beside the backend's.
    tags: Mapping[str, str] = field(default_factory=dict)
    #: The gateway's own SSH key: the public part is authorised on the host, the private part (sealed) logs in.
    public_key: str = ""
    private_key: str = ""


@dataclass(frozen=True)
class GatewayHost:
    """A host a backend brought up for a gateway."""

    #: Where the gateway answers: the IP address or DNS name users point the gateway's domain at.
    address: str
    #: How the server reaches the host again (as ``AgentEndpoint.connection``), kept with the gateway.
    connection: dict[str, Any]


@runtime_checkable
class GatewayProvisioner(Protocol):
    """A backend that can host a gateway (dstack: ``ComputeWithGatewaySupport``): it brings a host up for one,
    says its address, and tears it down (``aws``: a VM of its own, ``backends.aws.gateway_vm``)."""

    async def create_gateway(self, spec: GatewaySpec) -> GatewayHost:
        """Bring up a host for the gateway; raises :class:`ProvisioningError` when it cannot."""
        ...

    async def gateway_address(self, host: GatewayHost) -> str:
        """Where the gateway on ``host`` answers now (a cloud may give a host a new address after a stop)."""
        ...

    async def terminate_gateway(self, spec: GatewaySpec, host: GatewayHost) -> None:
        """Tear the gateway's host down (a no-op when it is gone already)."""
        ...
