"""``AWSCompute``: EC2 instances for cloud fleets, reached and run like SSH-fleet hosts.

Provisioning a reserved instance row (it exists before any EC2 call: the instances worker provisions rows
the scheduler committed) goes: look the row's instance up by its ``corral_instance`` tag (a server that
crashed after RunInstances finds it and adopts it); else RunInstances in the offer's region, one zone at a
time, then the row's fallback offers (other types, other regions) -- ``ClientToken`` ``corral-<row id>-<n>``,
a new ``n`` per attempt, at most ``launch.MAX_LAUNCH_ATTEMPTS`` -- tagged with this server's id, the
project, the fleet and the row; wait until it runs; then log in as root with the project's key (which the
UserData script authorised) and start the agent, through the SSH backend's code. The instance's resources
are its type's, from the catalogue. What this shares with gangs (``gangs``) -- EC2 in threads, the projects,
a region's set-up, the bring-up -- is the :class:`~corral.backends.aws.session.AWSSession` it holds.
Termination is confirmed by DescribeInstances before it returns (until then the row stays ``terminating``
and counts against ``nodes.max``); the reaper (:meth:`reap_orphans`) terminates instances tagged with this
server's id that no live row owns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from corral.backends.aws import catalog, ec2, gang_cleanup, gangs, gateway_vm, launch, reservations
from corral.backends.aws.interruptions import Lost, lost
from corral.backends.aws.live_catalog import CatalogSource
from corral.backends.aws.orphans import Tagged, orphans
from corral.backends.aws.session import (
    AWSProject,
    AWSSession,
    FleetLoader,
    ProjectLoader,
    Region,
    candidate_offers,
)
from corral.backends.base import AgentEndpoint, GatewayHost, GatewaySpec, Provisioned, ProvisioningError
from corral.backends.ssh import SSHCompute
from corral.domain.provisioning import STATUS_WORDS, FailureKind
from corral.domain.records import InstanceRec
from corral.scheduler.types import Offer

log = logging.getLogger("corral.aws")

#: The statuses of the instance rows of the ids given (a missing id: no such row), read when called.
RowStatuses = Callable[[list[str]], Awaitable[Mapping[str, str]]]


@dataclasses.dataclass
class _Tries:
    """The RunInstances calls one row's launch has made (bounded by ``launch.MAX_LAUNCH_ATTEMPTS``) and what
    each offer, region or zone that was not tried or failed said."""

    attempts: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)
    #: Why each failed, in the same order (``domain.provisioning``).
    kinds: list[FailureKind] = dataclasses.field(default_factory=list)

    def note(self, kind: FailureKind, text: str) -> None:
        self.kinds.append(kind)
        self.errors.append(text)

    def failure(self, candidates: list[Offer]) -> ProvisioningError:
        """Why nothing launched: no capacity if any offer, zone or region lacked it (waiting may help), else the
        first other reason (a quota, no image, the network, credentials...), said first."""
        tried = ", ".join(f"{o.instance_type} in {o.region}" for o in candidates)
        what = f"no offer could be launched ({tried}; {self.attempts} attempt(s)): {'; '.join(self.errors)}"
        if "no_capacity" in self.kinds or not self.kinds:
            return ProvisioningError(f"aws: {what}", "no_capacity")
        kind = self.kinds[0]
        return ProvisioningError(f"aws: {STATUS_WORDS[kind]}: {self.errors[0]}; {what}", kind)


class AWSCompute:
    name = "aws"
    owns_hosts = True

    def __init__(
        self,
        ssh: SSHCompute,
        projects: ProjectLoader,
        server_id: Callable[[], Awaitable[str]],
        catalog_path: Path | None = None,
        live_catalog_dir: Path | None = None,
        regions: frozenset[str] | None = None,
        provisioning_timeout: float = 600.0,
        poll: float = 1.0,
        unavailable_ttl: float = launch.UNAVAILABLE_TTL,
        terminate_timeout: float = 60.0,
        fleets: FleetLoader | None = None,
    ) -> None:
        self.ssh = ssh
        #: EC2 (in threads), the projects, the launches' shared parts: used by the gang code too.
        self.session = AWSSession(
            ssh, projects, server_id, provisioning_timeout, poll, unavailable_ttl, terminate_timeout,
            **({"fleets": fleets} if fleets is not None else {}),
        )  # fmt: skip
        #: Where offers are priced from: ``CORRAL_AWS_CATALOG``, the fetched gpuhunt catalogue, or the snapshot.
        self.catalog = CatalogSource(catalog_path, live_catalog_dir)
        self._offers: list[Offer] | None = None
        #: The regions offered (those the configured backends name; None: every region of the catalogue).
        self.regions = regions
        #: Clients of the interruption checks, by (region, credentials).
        self._watch_clients: dict[tuple[str, ec2.Creds], Any] = {}

    # ---- offers --------------------------------------------------------------------------------
    def offers(self) -> list[Offer]:
        if self._offers is None:
            self._offers = catalog.offers(self.catalog.current().rows, self.regions)
        return self._offers

    def catalog_info(self) -> catalog.CatalogInfo:
        """Which catalogue the offers are priced from, and how old it is."""
        return self.catalog.current().info

    def reload_catalog(self) -> catalog.CatalogInfo:
        """Price offers from the catalogue as it is now (after a fetch); returns where it comes from."""
        self.catalog.reload()
        self._offers = None
        return self.catalog_info()

    async def project(self, name: str) -> AWSProject:
        return await self.session.project(name)

    async def find_reservation(self, project_name: str, reservation_id: str) -> tuple[reservations.Reserved, ...]:
        """Where ``reservation_id`` is: asked in each region of the project's aws backend that has offers
        (reservation ids are regional; dstack asks every configured region too). Raises on EC2 errors."""
        project = await self.project(project_name)
        configured = project.config.get("regions")
        regions = sorted({o.region for o in self.offers() if not configured or o.region in configured})
        return await reservations.find(self.session, project, regions, reservation_id)

    # ---- provisioning --------------------------------------------------------------------------
    async def create_instance(self, instance: InstanceRec) -> Provisioned:
        project = await self.project(instance.project_name)
        candidates = candidate_offers(instance, project)
        client = await self.session.ec2(ec2.client, project.creds, candidates[0].region)
        found = await self._adoptable(instance, project, candidates, client)
        if found is not None:
            offer, client, ec2_id = found
            log.info("instance %s: adopting %s, launched before a restart", instance.name, ec2_id)
        else:
            offer, client, ec2_id = await self.run_instances(instance, project, candidates, client)
        try:
            provisioned = await self.session.bring_up(instance, project, client, offer, ec2_id)
        except Exception:
            await self._terminate_quietly(client, ec2_id)
            raise
        return dataclasses.replace(provisioned, offer=offer)  # the offer launched, in its zone

    async def create_gang(self, rows: list[InstanceRec], cluster: bool, reservation: str | None) -> list[Provisioned]:
        return await gangs.create_gang(self.session, rows, cluster, reservation)  # all together, or none

    async def _adoptable(
        self, instance: InstanceRec, project: AWSProject, candidates: list[Offer], client: Any
    ) -> tuple[Offer, Any, str] | None:
        """The instance a launch of this row made before a crash, found by its tag, in the regions the row
        may launch in (its own first: one DescribeInstances when there is nothing to adopt elsewhere)."""
        regions = list(dict.fromkeys(o.region for o in candidates))
        for region in regions:
            c = client if region == candidates[0].region else await self.session.ec2(ec2.client, project.creds, region)
            found = await self.session.ec2(ec2.by_tag, c, launch.TAG_INSTANCE, instance.id)
            if found:
                itype = str(found[0].get("InstanceType") or "")
                offer = next((o for o in candidates if o.region == region and o.instance_type == itype), None)
                zone = str((found[0].get("Placement") or {}).get("AvailabilityZone") or "")
                return dataclasses.replace(offer or candidates[0], zone=zone), c, str(found[0]["InstanceId"])
        return None

    async def run_instances(
        self, instance: InstanceRec, project: AWSProject, candidates: list[Offer], client: Any
    ) -> tuple[Offer, Any, str]:
        """RunInstances for the row: each candidate offer in turn, each of its region's zones in turn, at most
        ``MAX_LAUNCH_ATTEMPTS`` calls, each with a new client token; what failed is remembered a while
        (``Unavailable``) so that the next launches do not try it again."""
        server_id = await self.session.server_id()
        options = await self.session.fleet_options(instance)
        tags = launch.instance_tags(
            server_id,
            project.name,
            instance.fleet_name,
            instance.id,
            instance.name,
            self.session.tags(project, options),
        )
        tries = _Tries()
        regions: dict[str, Region] = {}
        images: dict[tuple[str, bool], ec2.Image] = {}
        for offer in candidates:
            ready = await self._region_and_image(offer, project, candidates, client, regions, images, tries)
            if ready is None:
                continue
            where, image = ready
            spec = launch.LaunchSpec(
                image=image.image_id,
                root_device=image.root_device,
                instance_type=offer.instance_type,
                spot=offer.resources.spot,
                security_group=where.group,
                tags=tags,
                public_key=project.ssh_public_key,
                public_ip=project.config.get("public_ips") is not False,
                iam_instance_profile=project.config.get("iam_instance_profile") or None,
            )
            launched, move = await self._launch_in_zones(instance, offer, where, spec, tries, options.zones)
            if launched is not None:
                return launched
            if move == "stop" or tries.attempts >= launch.MAX_LAUNCH_ATTEMPTS:
                break
        raise tries.failure(candidates)

    async def _region_and_image(
        self,
        offer: Offer,
        project: AWSProject,
        candidates: list[Offer],
        client: Any,
        regions: dict[str, Region],
        images: dict[tuple[str, bool], ec2.Image],
        tries: _Tries,
    ) -> tuple[Region, ec2.Image] | None:
        """The offer's region set up and its image (each looked up once per launch), or None (said in
        ``tries.errors``) when the region cannot take it now."""
        region, itype = offer.region, launch.market_key(offer.instance_type, offer.resources.spot)
        if self.session.unavailable.quota_blocked(region, offer.instance_type, offer.resources.spot, time.time()):
            tries.note("quota", f"{region} {itype}: quota reached lately")
            return None
        if region not in regions:
            c = client if region == candidates[0].region else await self.session.ec2(ec2.client, project.creds, region)
            try:
                regions[region] = await self.session.region(project, region, c)
            except ProvisioningError as e:
                if offer is candidates[0] and len(candidates) == 1:
                    raise
                tries.note(e.kind, str(e))
                return None
        where = regions[region]
        gpu = bool(offer.resources.gpus)
        if (region, gpu) not in images:
            try:
                images[(region, gpu)] = await self.session.ec2(ec2.image, where.client, project.config, gpu)
            except ec2.AWSError as e:
                tries.note("image", f"{region} {itype}: {e}")
                return None
        return where, images[(region, gpu)]

    async def _launch_in_zones(
        self,
        instance: InstanceRec,
        offer: Offer,
        where: Region,
        spec: launch.LaunchSpec,
        tries: _Tries,
        allowed: frozenset[str] | None,
    ) -> tuple[tuple[Offer, Any, str] | None, str]:
        """RunInstances of one offer in each of its zones (of the ``allowed`` ones: the fleet's
        ``availability_zones``) until one launches: (the offer in its zone, the region's client, the EC2 id), or
        None and where the launch goes next (``launch.next_move``)."""
        region, itype = offer.region, launch.market_key(offer.instance_type, offer.resources.spot)
        move = "zone"
        zones = launch.in_zone(where.zones, offer.zone, allowed)
        if not zones and allowed is not None:
            tries.note(
                "network",
                f"{region}: no usable subnet in the fleet's availability_zones ({', '.join(sorted(allowed))})",
            )
        for zone, subnet in zones.items():
            if self.session.unavailable.blocked(region, zone, itype, time.time()):
                tries.note("no_capacity", f"{zone} {itype}: no capacity lately")
                continue
            if tries.attempts >= launch.MAX_LAUNCH_ATTEMPTS:
                break
            tries.attempts += 1
            params = launch.run_params(
                spec, subnet, 1, launch.client_token(instance.id, tries.attempts), catalog.DISK_GIB
            )
            try:
                reply = await self.session.ec2(ec2.call, where.once, "run_instances", **params)
            except ec2.AWSError as e:
                verdict = launch.classify(e.code)
                move = launch.next_move(verdict)
                tries.note(launch.failure_kind(e.code), f"{zone} {itype}: {e}")
                log.info("instance %s: RunInstances %s in %s: %s (%s)", instance.name, itype, zone, e, verdict)
                if verdict == "capacity":
                    self.session.unavailable.mark(region, zone, itype, time.time())
                elif verdict == "quota":  # that market and quota group only, not the whole region
                    self.session.unavailable.mark_quota(region, offer.instance_type, offer.resources.spot, time.time())
                if move == "zone":
                    continue
                break
            launched = reply["Instances"][0]
            if launched.get("SpotInstanceRequestId"):  # so that the one-time request cannot be fulfilled again
                await self.session.cancel_spot_request(where.client, str(launched["SpotInstanceRequestId"]))
            return (dataclasses.replace(offer, zone=zone), where.client, str(launched["InstanceId"])), move
        return None, move

    async def _terminate_quietly(self, client: Any, ec2_id: str) -> None:
        try:
            await self.session.ec2(ec2.terminate, client, ec2_id)
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
        client = await self.session.ec2(ec2.client, project.creds, str(where["region"]))
        ec2_id = str(where["instance_id"])
        await self.session.ec2(ec2.terminate, client, ec2_id)
        deadline = time.monotonic() + self.session.terminate_timeout
        state = "unknown"
        while True:
            described = await self.session.ec2(ec2.state, client, ec2_id)
            if described is None or described["State"]["Name"] == "terminated":
                return await gang_cleanup.release_group(self.session, client, where)  # its placement group, if the last
            state = str(described["State"]["Name"])
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(self.session.poll)
        waited = self.session.terminate_timeout
        raise ProvisioningError(
            f"EC2 instance {ec2_id} is {state}, not terminated, {waited:g}s after TerminateInstances"
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
                    client = self._watch_clients[ck] = await self.session.ec2(ec2.client, project.creds, region)
                out.extend(lost(watched, await self.session.ec2(ec2.described, client, sorted(watched))))
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
        self, project: AWSProject, regions: list[str], rows: RowStatuses, grace: float, action: str
    ) -> list[Tagged]:
        """Terminate (or, with ``action`` ``report``, only log) this server's instances in ``regions`` whose
        row is missing or terminated and that were launched more than ``grace`` seconds ago. The rows are read
        (``rows``: the statuses of the row ids asked) after EC2 listed the instances: a row is committed before
        its launch's call, so every instance listed has its row by then, whichever replica launched it."""
        server_id = await self.session.server_id()
        found: list[Tagged] = []
        for region in regions:
            client = await self.session.ec2(ec2.client, project.creds, region)
            tagged = await self.session.ec2(ec2.owned, client, server_id)
            if not tagged:
                continue
            row_status = await rows(sorted({t.row_id for t in tagged}))
            for orphan in orphans(tagged, row_status, grace, time.time()):
                found.append(orphan)
                done = "reported only" if action == "report" else "terminating it"
                log.warning(
                    "orphan EC2 instance %s in %s (row %s): %s", orphan.instance_id, region, orphan.row_id, done
                )
                if action == "report":
                    continue
                await self.session.ec2(ec2.terminate, client, orphan.instance_id)
        return found

    # ---- gateways (``GatewayProvisioner``: a VM of its own per gateway) ---------------------------
    async def create_gateway(self, spec: GatewaySpec) -> GatewayHost:
        try:
            return await gateway_vm.create(self.session, spec)
        except ec2.AWSError as e:  # a call around the launch: throttled, refused...
            raise ProvisioningError(f"aws: {e}", launch.failure_kind(e.code) if e.code else "no_capacity") from None

    async def gateway_address(self, host: GatewayHost) -> str:
        return await gateway_vm.address(self.session, host)

    async def terminate_gateway(self, spec: GatewaySpec, host: GatewayHost) -> None:
        try:
            await gateway_vm.terminate(self.session, spec, host)
        except ec2.AWSError as e:
            raise ProvisioningError(f"aws: terminating the gateway's VM: {e}", launch.failure_kind(e.code)) from None

    async def aclose(self) -> None:
        await self.ssh.aclose()
