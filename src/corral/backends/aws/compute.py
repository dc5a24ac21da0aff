"""``AWSCompute``: EC2 instances for cloud fleets, reached and run like SSH-fleet hosts.

Provisioning a reserved instance row (it exists before any EC2 call: the instances worker provisions rows
the scheduler committed) goes: look the row's instance up by its ``corral_instance`` tag (a server that
crashed after RunInstances finds it and adopts it); else RunInstances in the offer's region, one zone at a
time, then the row's fallback offers (other types, other regions) -- ``ClientToken`` ``corral-<row id>-<n>``,
a new ``n`` per attempt, at most ``launch.MAX_LAUNCH_ATTEMPTS`` -- tagged with this server's id, the
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

from corral.backends.aws import catalog, ec2, gang_cleanup, gangs, launch
from corral.backends.aws.interruptions import Lost, lost
from corral.backends.aws.orphans import Tagged, orphans
from corral.backends.base import AgentEndpoint, Provisioned, ProvisioningError
from corral.backends.ssh import AUTHORISED_BY_USER_DATA, SSHCompute
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


@dataclass(frozen=True)
class _Region:
    """What launches in one region need: its clients (``once``: RunInstances, no botocore retries), the
    VPC's subnets by zone and the project's security group there."""

    client: Any
    once: Any
    zones: dict[str, str]
    group: str


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
        unavailable_ttl: float = launch.UNAVAILABLE_TTL,
        terminate_timeout: float = 60.0,
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
        self.unavailable = launch.Unavailable(ttl=unavailable_ttl)
        #: How long one termination waits for DescribeInstances to say ``terminated`` (then: tried again).
        self.terminate_timeout = terminate_timeout
        #: Clients of the interruption checks, by (region, credentials).
        self._watch_clients: dict[tuple[str, ec2.Creds], Any] = {}
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
        candidates = self._candidates(instance, project)
        client = await self._ec2(ec2.client, project.creds, candidates[0].region)
        found = await self._adoptable(instance, project, candidates, client)
        if found is not None:
            offer, client, ec2_id = found
            log.info("instance %s: adopting %s, launched before a restart", instance.name, ec2_id)
        else:
            offer, client, ec2_id = await self._launch(instance, project, candidates, client)
        try:
            provisioned = await self._bring_up(instance, project, client, offer, ec2_id)
        except Exception:
            await self._terminate_quietly(client, ec2_id)
            raise
        return dataclasses.replace(provisioned, offer=offer)  # the offer launched, in its zone

    async def create_gang(self, rows: list[InstanceRec], cluster: bool, reservation: str | None) -> list[Provisioned]:
        return await gangs.create_gang(self, rows, cluster, reservation)  # all together, or none: ``gangs``

    def _candidates(self, instance: InstanceRec, project: AWSProject) -> list[Offer]:
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

    async def _adoptable(
        self, instance: InstanceRec, project: AWSProject, candidates: list[Offer], client: Any
    ) -> tuple[Offer, Any, str] | None:
        """The instance a launch of this row made before a crash, found by its tag, in the regions the row
        may launch in (its own first: one DescribeInstances when there is nothing to adopt elsewhere)."""
        regions = list(dict.fromkeys(o.region for o in candidates))
        for region in regions:
            c = client if region == candidates[0].region else await self._ec2(ec2.client, project.creds, region)
            found = await self._ec2(ec2.by_tag, c, launch.TAG_INSTANCE, instance.id)
            if found:
                itype = str(found[0].get("InstanceType") or "")
                offer = next((o for o in candidates if o.region == region and o.instance_type == itype), None)
                zone = str((found[0].get("Placement") or {}).get("AvailabilityZone") or "")
                return dataclasses.replace(offer or candidates[0], zone=zone), c, str(found[0]["InstanceId"])
        return None

    async def _region(self, project: AWSProject, region: str, client: Any) -> _Region:
        try:
            vpc = await self._ec2(ec2.vpc_id, client, region, project.config)
            zones = await self._ec2(ec2.subnets_by_zone, client, vpc)
            group = await self._ec2(ec2.security_group, client, vpc, project.name)
        except ec2.AWSError as e:
            raise ProvisioningError(f"aws {region}: {e}") from None
        if not zones:
            raise ProvisioningError(f"aws {region}: the VPC {vpc} has no subnets")
        once = await self._ec2(ec2.client, project.creds, region, "ec2", True)
        return _Region(client, once, zones, group)

    async def _launch(
        self, instance: InstanceRec, project: AWSProject, candidates: list[Offer], client: Any
    ) -> tuple[Offer, Any, str]:
        """RunInstances for the row: each candidate offer in turn, each of its region's zones in turn, at most
        ``MAX_LAUNCH_ATTEMPTS`` calls, each with a new client token; what failed is remembered a while
        (``Unavailable``) so that the next launches do not try it again."""
        server_id = await self._server_id()
        tags = launch.instance_tags(
            server_id, project.name, instance.fleet_name, instance.id, instance.name, project.config.get("tags")
        )
        public_ip = project.config.get("public_ips") is not False
        errors: list[str] = []
        regions: dict[str, _Region] = {}
        images: dict[tuple[str, bool], str] = {}
        attempt = 0
        for offer in candidates:
            region, itype = offer.region, launch.market_key(offer.instance_type, offer.resources.spot)
            if self.unavailable.region_blocked(region, time.time()):
                errors.append(f"{region}: quota reached lately")
                continue
            if region not in regions:
                c = client if region == candidates[0].region else await self._ec2(ec2.client, project.creds, region)
                try:
                    regions[region] = await self._region(project, region, c)
                except ProvisioningError as e:
                    if offer is candidates[0] and len(candidates) == 1:
                        raise
                    errors.append(str(e))
                    continue
            where = regions[region]
            gpu = bool(offer.resources.gpus)
            if (region, gpu) not in images:
                try:
                    images[(region, gpu)], _user = await self._ec2(ec2.image, where.client, project.config, gpu)
                except ec2.AWSError as e:
                    errors.append(f"{region} {itype}: {e}")
                    continue
            move = "zone"
            for zone, subnet in launch.in_zone(where.zones, offer.zone).items():
                if self.unavailable.blocked(region, zone, itype, time.time()):
                    errors.append(f"{zone} {itype}: no capacity lately")
                    continue
                if attempt >= launch.MAX_LAUNCH_ATTEMPTS:
                    break
                attempt += 1
                params: dict[str, Any] = {
                    "ImageId": images[(region, gpu)],
                    "InstanceType": offer.instance_type,
                    "MinCount": 1,
                    "MaxCount": 1,
                    "ClientToken": launch.client_token(instance.id, attempt),
                    "UserData": launch.user_data([project.ssh_public_key]),
                    "BlockDeviceMappings": [
                        {"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": catalog.DISK_GIB, "VolumeType": "gp3"}}
                    ],
                    "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
                    "NetworkInterfaces": [
                        {"DeviceIndex": 0, "SubnetId": subnet, "Groups": [where.group],
                         "AssociatePublicIpAddress": public_ip}
                    ],
                }  # fmt: skip
                if offer.resources.spot:  # one-time, terminated on interruption (dstack's; no MaxPrice)
                    params["InstanceMarketOptions"] = launch.SPOT_MARKET
                if project.config.get("iam_instance_profile"):
                    params["IamInstanceProfile"] = {"Name": project.config["iam_instance_profile"]}
                try:
                    reply = await self._ec2(ec2.call, where.once, "run_instances", **params)
                except ec2.AWSError as e:
                    verdict = launch.classify(e.code)
                    move = launch.next_move(verdict)
                    errors.append(f"{zone} {itype}: {e}")
                    log.info("instance %s: RunInstances %s in %s: %s (%s)", instance.name, itype, zone, e, verdict)
                    if verdict == "capacity":
                        self.unavailable.mark(region, zone, itype, time.time())
                    elif verdict == "quota":
                        self.unavailable.mark_region(region, time.time())
                    if move == "zone":
                        continue
                    break
                launched = reply["Instances"][0]
                if launched.get("SpotInstanceRequestId"):  # so that the one-time request cannot be fulfilled again
                    await self._cancel_spot_request(where.client, str(launched["SpotInstanceRequestId"]))
                return dataclasses.replace(offer, zone=zone), where.client, str(launched["InstanceId"])
            if move == "stop" or attempt >= launch.MAX_LAUNCH_ATTEMPTS:
                break
        tried = ", ".join(f"{o.instance_type} in {o.region}" for o in candidates)
        raise ProvisioningError(f"aws: no offer could be launched ({tried}; {attempt} attempt(s)): {'; '.join(errors)}")

    async def _cancel_spot_request(self, client: Any, request_id: str) -> None:
        try:
            await self._ec2(ec2.call, client, "cancel_spot_instance_requests", SpotInstanceRequestIds=[request_id])
        except ec2.AWSError as e:  # the instance runs anyway; the request is one-time
            log.warning("could not cancel spot request %s: %s", request_id, e)

    async def _bring_up(
        self, instance: InstanceRec, project: AWSProject, client: Any, offer: Offer, ec2_id: str
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
            AUTHORISED_BY_USER_DATA: True,  # cloud-init may not have run it yet when sshd answers
            "aws": {"instance_id": ec2_id, "region": offer.region, "project": project.name},
        }
        as_host = dataclasses.replace(instance, agent={"token": secrets.token_hex(24), "connection": connection})
        provisioned = await self.ssh.create_instance(as_host)
        return dataclasses.replace(
            provisioned, resources=offer.resources, total_blocks=instance.total_blocks or provisioned.total_blocks
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
        deadline = time.monotonic() + self.terminate_timeout
        state = "unknown"
        while True:
            described = await self._ec2(ec2.state, client, ec2_id)
            if described is None or described["State"]["Name"] == "terminated":
                return await gang_cleanup.release_group(self, client, where)  # its placement group, if the last
            state = str(described["State"]["Name"])
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(self.poll)
        raise ProvisioningError(
            f"EC2 instance {ec2_id} is {state}, not terminated, {self.terminate_timeout:g}s after TerminateInstances"
        )

    async def lost_instances(self, live: list[InstanceRec]) -> list[Lost]:
        """Those of ``live`` (idle or busy rows of this backend) whose EC2 instance is going or gone: one
        DescribeInstances per project and region."""
        groups: dict[tuple[str, str], dict[str, str]] = {}
        for inst in live:
            where = ((inst.agent or {}).get("connection") or {}).get("aws")
            if where:
                key = (str(where["project"]), str(where["region"]))
                groups.setdefault(key, {})[str(where["instance_id"])] = inst.id
        out: list[Lost] = []
        for (project_name, region), watched in groups.items():
            try:
                project = await self.project(project_name)
                ck = (region, project.creds)
                client = self._watch_clients.get(ck)
                if client is None:  # kept: this runs on every host check
                    client = self._watch_clients[ck] = await self._ec2(ec2.client, project.creds, region)
                out.extend(lost(watched, await self._ec2(ec2.described, client, sorted(watched))))
            except (ProvisioningError, ec2.AWSError) as e:  # the next check asks again
                log.warning(
                    "could not ask EC2 about %d instance(s) of %s in %s: %s", len(watched), project_name, region, e
                )
        return out

    async def forget(self, instance_id: str) -> None:
        """Drop what the server holds of an instance EC2 took away (its SSH link)."""
        await self.ssh.terminate_instance(instance_id, None)

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
                done = "reported only" if action == "report" else "terminating it"
                log.warning(
                    "orphan EC2 instance %s in %s (row %s): %s", orphan.instance_id, region, orphan.row_id, done
                )
                if action == "report":
                    continue
                await self._ec2(ec2.terminate, client, orphan.instance_id)
        return found

    async def aclose(self) -> None:
        await self.ssh.aclose()
