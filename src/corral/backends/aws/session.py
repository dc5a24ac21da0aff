"""What the aws backend's EC2 work shares, whoever does it: :class:`AWSSession`.

It owns the hop to boto3 (:meth:`AWSSession.ec2`: every call in a thread, counted by operation), the
projects' ``type: aws`` documents and keys (:class:`AWSProject`), this server's id (the tag of its instances),
what launches remember failed lately (``launch.Unavailable``), a region made ready for launches
(:meth:`AWSSession.region`: the VPC's usable subnets by zone, the project's security group), a row's candidate
offers (:func:`candidate_offers`), and an instance brought up once EC2 launched it (:meth:`AWSSession.bring_up`:
running, then logged into as root to start the agent, through the SSH backend's code).

The single-instance path (``compute``), gangs (``gangs``, ``gang_cleanup``) and capacity reservations use it;
none of them knows the ``Compute`` (``compute.AWSCompute``), which holds the session.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from corral.backends.aws import ec2, launch
from corral.backends.base import Provisioned, ProvisioningError
from corral.backends.ssh import AUTHORISED_BY_USER_DATA, SSHCompute
from corral.domain import aws_tags
from corral.domain.records import InstanceRec
from corral.scheduler.codec import offer_from_json, resources_from_json
from corral.scheduler.fallbacks import FALLBACKS_KEY
from corral.scheduler.types import Offer

log = logging.getLogger("corral.aws")


@dataclass(frozen=True)
class AWSProject:
    """What a launch needs of the project: its ``type: aws`` document (credentials opened), its SSH key."""

    name: str
    config: dict[str, Any]
    ssh_public_key: str
    #: As stored (sealed): opened by the SSH code only to log in.
    ssh_private_key: str

    @property
    def creds(self) -> ec2.Creds:
        c = self.config.get("creds") or {}
        if c.get("type") == "access_key":
            return ec2.Creds(c.get("access_key"), c.get("secret_key"))
        return ec2.Creds()


ProjectLoader = Callable[[str], Awaitable[AWSProject | None]]


@dataclass(frozen=True)
class FleetOptions:
    """What a fleet's configuration asks of the instances launched for it: the availability zones they may
    launch in (None: any of the VPC's) and the tags they carry besides corral's and the backend's."""

    zones: frozenset[str] | None = None
    tags: dict[str, str] = dataclasses.field(default_factory=dict)


#: The options of the fleet an instance row belongs to (none for a row of no fleet).
FleetLoader = Callable[[InstanceRec], Awaitable[FleetOptions]]


async def _no_options(instance: InstanceRec) -> FleetOptions:
    return FleetOptions()


@dataclass(frozen=True)
class Region:
    """What launches in one region need: its clients (``once``: RunInstances, no botocore retries), the
    VPC's subnets by zone and the project's security group there."""

    client: Any
    once: Any
    zones: dict[str, str]
    group: str


def candidate_offers(instance: InstanceRec, project: AWSProject) -> list[Offer]:
    """The row's offer, then its fallbacks (``scheduler.fallbacks``) in the backend's regions."""
    raw = instance.offer or {}
    region = str(raw.get("region") or instance.region or "")
    itype = str(raw.get("instance_type") or "")
    if not region or not itype:
        raise ProvisioningError(f"instance {instance.name} has no AWS offer (instance type and region)")
    regions = project.config.get("regions")
    if regions and region not in regions:
        raise ProvisioningError(f"region {region} is not among the aws backend's regions ({', '.join(regions)})")
    primary = Offer(
        "aws", itype, region, float(raw.get("price") or instance.price or 0.0),
        resources_from_json(raw.get("resources") or {}), zone=str(raw.get("zone") or ""),
    )  # fmt: skip
    others = [offer_from_json(o) for o in raw.get(FALLBACKS_KEY) or []]
    return [primary, *(o for o in others if o.backend == "aws" and (not regions or o.region in regions))]


class AWSSession:
    """The aws backend's access to EC2 and to the projects it launches for (see the module's docstring)."""

    def __init__(
        self,
        ssh: SSHCompute,
        projects: ProjectLoader,
        server_id: Callable[[], Awaitable[str]],
        provisioning_timeout: float = 600.0,
        poll: float = 1.0,
        unavailable_ttl: float = launch.UNAVAILABLE_TTL,
        terminate_timeout: float = 60.0,
        fleets: FleetLoader = _no_options,
    ) -> None:
        self.ssh = ssh
        self._projects = projects
        self._fleets = fleets
        self._server_id = server_id
        self.provisioning_timeout = provisioning_timeout
        self.poll = poll
        self.unavailable = launch.Unavailable(ttl=unavailable_ttl)
        #: How long one termination waits for DescribeInstances to say ``terminated`` (then: tried again).
        self.terminate_timeout = terminate_timeout
        #: EC2 calls made, by operation (the benchmark reads it).
        self.calls: dict[str, int] = {}

    async def ec2(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` (a function of ``ec2``, or one that calls boto3) in a thread, counted."""
        name = str(args[1]) if fn is ec2.call else getattr(fn, "__name__", "call")
        self.calls[name] = self.calls.get(name, 0) + 1
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def project(self, name: str) -> AWSProject:
        project = await self._projects(name)
        if project is None:
            raise ProvisioningError(f"project {name} has no aws backend configured")
        return project

    async def fleet_options(self, instance: InstanceRec) -> FleetOptions:
        """What the row's fleet asks of its instances (``availability_zones``, ``tags``)."""
        return await self._fleets(instance)

    def tags(self, project: AWSProject, options: FleetOptions) -> dict[str, str]:
        """The tags besides corral's on what is made for a fleet: the backend's, then the fleet's."""
        return aws_tags.joined(project.config.get("tags"), options.tags)

    async def server_id(self) -> str:
        """This server's id: the tag of every instance and placement group it launches."""
        return await self._server_id()

    async def region(self, project: AWSProject, region: str, client: Any) -> Region:
        """``region`` made ready for the project's launches (``client``: one of that region)."""
        public_ips = project.config.get("public_ips") is not False
        try:
            where = await self.ec2(ec2.vpc, client, region, project.config)
            zones = await self.ec2(ec2.subnets_by_zone, client, where, public_ips)
            if not zones:
                raise ProvisioningError(f"aws {region}: {ec2.no_subnet(where, region, public_ips)}", "network")
            admin_tags = dict(project.config.get("tags") or {})  # the project's group: the backend's tags only
            group = await self.ec2(ec2.security_group, client, where.vpc_id, project.name, admin_tags)
        except ec2.AWSError as e:
            kind = launch.failure_kind(e.code) if e.code else "network"
            raise ProvisioningError(f"aws {region}: {e}", "network" if kind == "refused" else kind) from None
        once = await self.ec2(ec2.client, project.creds, region, "ec2", True)
        return Region(client, once, zones, group)

    async def cancel_spot_request(self, client: Any, request_id: str) -> None:
        """Cancel a one-time spot request whose instance launched, so that it cannot be fulfilled again."""
        try:
            await self.ec2(ec2.call, client, "cancel_spot_instance_requests", SpotInstanceRequestIds=[request_id])
        except ec2.AWSError as e:  # the instance runs anyway; the request is one-time
            log.warning("could not cancel spot request %s: %s", request_id, e)

    async def bring_up(
        self, instance: InstanceRec, project: AWSProject, client: Any, offer: Offer, ec2_id: str
    ) -> Provisioned:
        """Wait until ``ec2_id`` runs, then log in as root with the project's key (which the UserData script
        authorised) and start the agent, as the SSH backend does; its resources are ``offer``'s."""
        deadline = time.monotonic() + self.provisioning_timeout
        while True:
            described = await self.ec2(ec2.state, client, ec2_id)
            state = ((described or {}).get("State") or {}).get("Name")
            if state == "running":
                break
            if state in ("shutting-down", "terminated", "stopping", "stopped"):
                raise ProvisioningError(f"EC2 instance {ec2_id} is {state} before it ran")
            if time.monotonic() > deadline:
                raise ProvisioningError(f"EC2 instance {ec2_id} did not reach running in time")
            await asyncio.sleep(self.poll)
        assert described is not None
        public = project.config.get("public_ips") is not False
        host = described.get("PublicIpAddress") if public else None
        host = host or described.get("PrivateIpAddress")
        if not host:
            raise ProvisioningError(f"EC2 instance {ec2_id} has no IP address")
        connection = {
            "host": host,
            "port": 22,
            "user": "root",
            "private_key": project.ssh_private_key,
            "proxy_jump": None,
            "internal_ip": described.get("PrivateIpAddress"),
            "blocks": 1,
            AUTHORISED_BY_USER_DATA: True,  # cloud-init may not have run it yet when sshd answers
            "aws": {"instance_id": ec2_id, "region": offer.region, "project": project.name},
        }
        as_host = dataclasses.replace(instance, agent={"token": secrets.token_hex(24), "connection": connection})
        provisioned = await self.ssh.create_instance(as_host)
        return dataclasses.replace(
            provisioned, resources=offer.resources, total_blocks=instance.total_blocks or provisioned.total_blocks
        )
