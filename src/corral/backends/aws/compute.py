"""``AWSCompute``: EC2 instances for cloud fleets, reached and run like SSH-fleet hosts.

Provisioning a reserved instance row (it exists before any EC2 call: the instances worker provisions rows
the scheduler committed) goes: look the row's instance up by its ``corral_instance`` tag (a server that
crashed after RunInstances finds it and adopts it); else RunInstances in the offer's region, one zone at a
time (``ClientToken`` ``corral-<row id>-<n>``, a new ``n`` per zone), tagged with this server's id, the
project, the fleet and the row; wait until it runs; then log in as root with the project's key (which the
UserData script authorised) and start the agent, through the SSH backend's code. The instance's resources
are its type's, from the catalogue. Termination is confirmed by DescribeInstances before it returns (until
then the row stays ``terminating`` and counts against ``nodes.max``); the reaper (:meth:`reap_orphans`)
terminates instances tagged with this server's id that no live row owns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.backends.aws import catalog, ec2, launch
from corral.backends.aws.orphans import Tagged, orphans
from corral.backends.base import AgentEndpoint, Provisioned, ProvisioningError
from corral.backends.ssh import SSHCompute
from corral.domain.records import InstanceRec
from corral.scheduler.codec import resources_from_json
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


class AWSCompute:
    name = "aws"

    def __init__(
        self,
        ssh: SSHCompute,
        projects: ProjectLoader,
        server_id: Callable[[], Awaitable[str]],
        catalog_path: Path | None = None,
        regions: frozenset[str] | None = None,
        provisioning_timeout: float = 600.0,
        poll: float = 1.0,
    ) -> None:
        self.ssh = ssh
        self._projects = projects
        self._server_id = server_id
        self._catalog_path = catalog_path
        self._offers: list[Offer] | None = None
        #: The regions offered (those the configured backends name; None: every region of the catalogue).
        self.regions = regions
        self.provisioning_timeout = provisioning_timeout
        self.poll = poll
        self.unavailable = launch.Unavailable()
        #: EC2 calls made, by operation (the benchmark reads it).
        self.calls: dict[str, int] = {}

    # ---- offers --------------------------------------------------------------------------------
    def offers(self) -> list[Offer]:
        if self._offers is None:
            self._offers = catalog.offers(catalog.load(self._catalog_path), self.regions)
        return self._offers

    # ---- EC2, in threads -----------------------------------------------------------------------
    async def _ec2(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        name = str(args[1]) if fn is ec2.call else getattr(fn, "__name__", "call")
        self.calls[name] = self.calls.get(name, 0) + 1
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def project(self, name: str) -> AWSProject:
        project = await self._projects(name)
        if project is None:
            raise ProvisioningError(f"project {name} has no aws backend configured")
        return project

    # ---- provisioning --------------------------------------------------------------------------
    async def create_instance(self, instance: InstanceRec) -> Provisioned:
        project = await self.project(instance.project_name)
        offer = instance.offer or {}
        region = str(offer.get("region") or instance.region or "")
        itype = str(offer.get("instance_type") or "")
        if not region or not itype:
            raise ProvisioningError(f"instance {instance.name} has no AWS offer (instance type and region)")
        regions = project.config.get("regions")
        if regions and region not in regions:
            raise ProvisioningError(f"region {region} is not among the aws backend's regions ({', '.join(regions)})")
        client = await self._ec2(ec2.client, project.creds, region)
        found = await self._ec2(ec2.by_tag, client, launch.TAG_INSTANCE, instance.id)
        if found:
            ec2_id = str(found[0]["InstanceId"])
            log.info("instance %s: adopting %s, launched before a restart", instance.name, ec2_id)
        else:
            ec2_id = await self._launch(instance, project, client, region, itype, offer)
        try:
            return await self._bring_up(instance, project, client, region, ec2_id)
        except Exception:
            await self._terminate_quietly(client, ec2_id)
            raise

    async def _launch(
        self, instance: InstanceRec, project: AWSProject, client: Any, region: str, itype: str, offer: dict[str, Any]
    ) -> str:
        try:
            vpc = await self._ec2(ec2.vpc_id, client, region, project.config)
            zones = await self._ec2(ec2.subnets_by_zone, client, vpc)
            group = await self._ec2(ec2.security_group, client, vpc, project.name)
            gpu = bool((offer.get("resources") or {}).get("gpus"))
            ami, _user = await self._ec2(ec2.image, client, project.config, gpu)
        except ec2.AWSError as e:
            raise ProvisioningError(f"aws {region}: {e}") from None
        if not zones:
            raise ProvisioningError(f"aws {region}: the VPC {vpc} has no subnets")
        server_id = await self._server_id()
        tags = launch.instance_tags(
            server_id, project.name, instance.fleet_name, instance.id, instance.name, project.config.get("tags")
        )
        public_ip = project.config.get("public_ips") is not False
        errors: list[str] = []
        once = await self._ec2(ec2.client, project.creds, region, "ec2", True)
        for attempt, (zone, subnet) in enumerate(zones.items(), start=1):
            if self.unavailable.blocked(itype, zone, time.time()):
                errors.append(f"{zone}: no capacity lately")
                continue
            params: dict[str, Any] = {
                "ImageId": ami,
                "InstanceType": itype,
                "MinCount": 1,
                "MaxCount": 1,
                "ClientToken": launch.client_token(instance.id, attempt),
                "UserData": launch.user_data([project.ssh_public_key]),
                "BlockDeviceMappings": [
                    {"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": catalog.DISK_GIB, "VolumeType": "gp3"}}
                ],
                "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
                "NetworkInterfaces": [
                    {"DeviceIndex": 0, "SubnetId": subnet, "Groups": [group], "AssociatePublicIpAddress": public_ip}
                ],
            }
            if project.config.get("iam_instance_profile"):
                params["IamInstanceProfile"] = {"Name": project.config["iam_instance_profile"]}
            try:
                reply = await self._ec2(ec2.call, once, "run_instances", **params)
            except ec2.AWSError as e:
                verdict = launch.classify(e.code)
                errors.append(f"{zone}: {e}")
                log.info("instance %s: RunInstances in %s: %s (%s)", instance.name, zone, e, verdict)
                if verdict == "capacity":
                    self.unavailable.mark(itype, zone, time.time())
                    continue
                if verdict == "transient":
                    continue
                break  # quota (the region), invalid parameters (the offer), others: no other zone will do
            return str(reply["Instances"][0]["InstanceId"])
        raise ProvisioningError(f"aws {region} {itype}: no zone could launch it ({'; '.join(errors)})")

    async def _bring_up(
        self, instance: InstanceRec, project: AWSProject, client: Any, region: str, ec2_id: str
    ) -> Provisioned:
        deadline = time.monotonic() + self.provisioning_timeout
        while True:
            described = await self._ec2(ec2.state, client, ec2_id)
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
            "aws": {"instance_id": ec2_id, "region": region, "project": project.name},
        }
        as_host = dataclasses.replace(instance, agent={"token": secrets.token_hex(24), "connection": connection})
        provisioned = await self.ssh.create_instance(as_host)
        resources = resources_from_json((instance.offer or {}).get("resources") or {})
        return dataclasses.replace(
            provisioned, resources=resources, total_blocks=instance.total_blocks or provisioned.total_blocks
        )

    async def _terminate_quietly(self, client: Any, ec2_id: str) -> None:
        try:
            await self._ec2(ec2.terminate, client, ec2_id)
        except Exception as e:  # the reaper finds it later
            log.warning("could not terminate %s after a failed provisioning: %s", ec2_id, e)

    # ---- reaching the agent ----------------------------------------------------------------------
    def agent_url(self, instance: InstanceRec) -> str:
        return self.ssh.agent_url(instance)

    async def recover(self, instance: InstanceRec) -> None:
        await self.ssh.recover(instance)

    # ---- termination ---------------------------------------------------------------------------
    async def terminate_instance(self, instance_id: str, agent: AgentEndpoint | None) -> None:
        """Terminate and return only once DescribeInstances says ``terminated`` (raises otherwise, and the
        worker tries again: the row keeps counting against ``nodes.max`` meanwhile)."""
        where = (agent.connection or {}).get("aws") if agent is not None else None
        await self.ssh.terminate_instance(instance_id, None)  # drop the SSH link; the VM goes with its files
        if not where:
            return  # never launched as far as the row knows: a stray one is the reaper's
        project = await self.project(str(where["project"]))
        client = await self._ec2(ec2.client, project.creds, str(where["region"]))
        ec2_id = str(where["instance_id"])
        await self._ec2(ec2.terminate, client, ec2_id)
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            described = await self._ec2(ec2.state, client, ec2_id)
            if described is None or described["State"]["Name"] == "terminated":
                return
            await asyncio.sleep(self.poll)
        raise ProvisioningError(f"EC2 instance {ec2_id} is not terminated yet; trying again")

    async def reap_unknown(self, known_instance_ids: set[str]) -> list[str]:
        return await self.ssh.reap_unknown(known_instance_ids)

    async def reap_orphans(
        self, project: AWSProject, regions: list[str], row_status: dict[str, str], grace: float, action: str
    ) -> list[Tagged]:
        """Terminate (or, with ``action`` ``report``, only log) this server's instances in ``regions`` whose
        row is missing or terminated and that were launched more than ``grace`` seconds ago."""
        server_id = await self._server_id()
        found: list[Tagged] = []
        for region in regions:
            client = await self._ec2(ec2.client, project.creds, region)
            tagged = await self._ec2(ec2.owned, client, server_id)
            for orphan in orphans(tagged, row_status, grace, time.time()):
                found.append(orphan)
                if action == "report":
                    log.warning(
                        "orphan EC2 instance %s in %s (row %s): reported only",
                        orphan.instance_id,
                        region,
                        orphan.row_id,
                    )
                    continue
                log.warning(
                    "terminating orphan EC2 instance %s in %s (row %s)", orphan.instance_id, region, orphan.row_id
                )
                await self._ec2(ec2.terminate, client, orphan.instance_id)
        return found

    async def aclose(self) -> None:
        await self.ssh.aclose()
