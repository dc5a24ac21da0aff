"""A gateway's VM on EC2 (the aws backend's ``GatewayProvisioner``): one instance of its own, launched through
the instances' path and reaped by the same reaper.

* the image: the backend's own lookup (``ec2.image``: the newest Ubuntu 22.04 AMI, or ``os_images.cpu``);
* the subnet: the backend's own choice by route table (``ec2.vpc``, ``ec2.subnets_by_zone``), with a public IP
  unless the gateway says ``public_ip: false`` (then a subnet that reaches out through NAT, as for instances);
* the security group ``corral_gw_<project>``: SSH, HTTP and HTTPS from anywhere (:func:`security_group`);
* the tags: corral's (``launch.instance_tags``: the server, the project, the gateway's row id as
  ``corral_instance``, which the reaper and the adoption read back), ``corral_gateway``, the backend's and the
  gateway's ``tags``; the ``ClientToken`` ``corral-<gateway id>-<n>``;
* the login: root with the gateway's own key (made per gateway by the server, kept sealed), which the
  instances' UserData script authorises;
* adoption: a VM tagged with the gateway's id that a launch made before a restart is taken, not launched twice.

No boto3 here: EC2 calls go through ``ec2`` in the session's threads. Imports ``backends.aws``,
``backends.base`` and ``domain`` only.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from corral.backends.aws import ec2, launch
from corral.backends.aws.session import AWSProject, AWSSession
from corral.backends.base import GatewayHost, GatewaySpec, ProvisioningError
from corral.domain import aws_tags
from corral.domain.gateways import AWS_INSTANCE_TYPE

#: The gateway's tag: the gateway's id (beside ``corral_instance``, which holds the same id for the reaper).
TAG_GATEWAY = aws_tags.TAG_GATEWAY
#: The ports a gateway's security group opens to the world: SSH (the server's connection), HTTP (ACME's
#: HTTP-01 challenges and the redirect) and HTTPS -- as dstack's gateway group ``dstack_gw_sg_<project>``,
#: open to the world on 22, 80 and 443 (dstack 0.22.5, ``core/backends/aws``: its gateway's security group).
GATEWAY_PORTS = (22, 80, 443)
#: The root volume of a gateway's VM (GiB), corral's choice: it holds the gateway's program, state and
#: certificates only (an instance's 100 GiB would be paid for nothing). An ``os_images.cpu`` image whose root
#: snapshot is larger is refused by RunInstances, and the gateway fails with EC2's reason.
GATEWAY_DISK_GIB = 10


def group_name(project: str) -> str:
    """``corral_gw_<project>``: the project's gateways' security group (a name up to 255 characters that does
    not start with ``sg-``: AWS's CreateSecurityGroup ``GroupName``, aws-facts I6)."""
    return f"corral_gw_{project}"[:255]


def ingress_rules() -> list[dict[str, Any]]:
    """AuthorizeSecurityGroupIngress' ``IpPermissions`` (botocore's input shape: ``IpProtocol``, ``FromPort``,
    ``ToPort``, ``IpRanges``) of the gateway group: tcp :data:`GATEWAY_PORTS` from 0.0.0.0/0. A new group lets
    everything out already (its default egress rule, aws-facts I5)."""
    return [
        {"IpProtocol": "tcp", "FromPort": p, "ToPort": p, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]} for p in GATEWAY_PORTS
    ]


def security_group(client: Any, vpc: str, project: str, tags: dict[str, str]) -> str:
    """The project's gateway group in ``vpc`` (made on first use, tagged with the backend's ``tags`` and corral's).
    Blocking: run in the session's thread."""
    name = group_name(project)
    filters = [{"Name": "group-name", "Values": [name]}, {"Name": "vpc-id", "Values": [vpc]}]
    found = ec2.call(client, "describe_security_groups", Filters=filters)["SecurityGroups"]
    if found:
        return str(found[0]["GroupId"])
    own = {**{k: v for k, v in tags.items() if k not in aws_tags.CORRAL_KEYS}, "owner": "corral"}
    own[aws_tags.TAG_PROJECT] = project
    try:
        group = str(
            ec2.call(
                client, "create_security_group", GroupName=name, VpcId=vpc,
                Description=f"corral gateways of project {project}: ports 22, 80, 443",
                TagSpecifications=[{"ResourceType": "security-group",
                                    "Tags": [{"Key": k, "Value": v} for k, v in own.items()]}],
            )["GroupId"]
        )  # fmt: skip
    except ec2.AWSError as e:  # another launch made it meanwhile (AWS error code, aws-facts G13)
        if e.code != "InvalidGroup.Duplicate":
            raise
        return security_group(client, vpc, project, tags)
    try:
        ec2.call(client, "authorize_security_group_ingress", GroupId=group, IpPermissions=ingress_rules())
    except ec2.AWSError as e:
        if e.code != "InvalidPermission.Duplicate":
            raise
    return group


def gateway_tags(server_id: str, project: AWSProject, spec: GatewaySpec) -> list[dict[str, str]]:
    """The VM's tags: the backend's and the gateway's ``tags``, then corral's (the row id is the gateway's)."""
    joined = aws_tags.joined(project.config.get("tags"), dict(spec.tags))
    extra = {k: v for k, v in joined.items() if k != TAG_GATEWAY}
    tags = launch.instance_tags(server_id, project.name, None, spec.gateway_id, f"gw-{spec.name}", extra)
    return [*tags, {"Key": TAG_GATEWAY, "Value": spec.gateway_id}]


@dataclass(frozen=True)
class _Where:
    client: Any
    once: Any
    zones: dict[str, str]
    group: str


async def _region(session: AWSSession, project: AWSProject, spec: GatewaySpec, client: Any) -> _Where:
    """The region made ready for the gateway: its subnets (public ones unless ``public_ip: false``) and group."""
    region = spec.region or ""
    try:
        where = await session.ec2(ec2.vpc, client, region, project.config)
        zones = await session.ec2(ec2.subnets_by_zone, client, where, spec.public_ip)
        if not zones:
            raise ProvisioningError(f"aws {region}: {ec2.no_subnet(where, region, spec.public_ip)}", "network")
        admin = dict(project.config.get("tags") or {})
        group = await session.ec2(security_group, client, where.vpc_id, project.name, admin)
    except ec2.AWSError as e:
        raise ProvisioningError(
            f"aws {spec.region}: {e}", launch.failure_kind(e.code) if e.code else "network"
        ) from None
    once = await session.ec2(ec2.client, project.creds, region, "ec2", True)
    return _Where(client, once, zones, group)


async def launch_vm(session: AWSSession, spec: GatewaySpec) -> tuple[Any, str]:
    """The gateway's VM: the one a launch made before (found by its tag), else launched zone by zone (at most
    ``launch.MAX_LAUNCH_ATTEMPTS`` RunInstances). Returns (the region's client, the EC2 id)."""
    project = await session.project(spec.project_name)
    client = await session.ec2(ec2.client, project.creds, spec.region)
    found = await session.ec2(ec2.by_tag, client, launch.TAG_INSTANCE, spec.gateway_id)
    if found:
        return client, str(found[0]["InstanceId"])
    where = await _region(session, project, spec, client)
    try:
        image = await session.ec2(ec2.image, client, project.config, False)
    except ec2.AWSError as e:
        raise ProvisioningError(f"aws {spec.region}: {e}", "image") from None
    tags = gateway_tags(await session.server_id(), project, spec)
    launch_spec = launch.LaunchSpec(
        image=image.image_id, root_device=image.root_device, instance_type=spec.instance_type or AWS_INSTANCE_TYPE,
        spot=False, security_group=where.group, tags=tags, public_key=spec.public_key, public_ip=spec.public_ip,
    )  # fmt: skip
    errors: list[str] = []
    for attempt, (zone, subnet) in enumerate(list(where.zones.items())[: launch.MAX_LAUNCH_ATTEMPTS], start=1):
        params = launch.run_params(
            launch_spec, subnet, 1, launch.client_token(spec.gateway_id, attempt), GATEWAY_DISK_GIB
        )
        try:
            reply = await session.ec2(ec2.call, where.once, "run_instances", **params)
        except ec2.AWSError as e:
            errors.append(f"{zone}: {e}")
            if launch.next_move(launch.classify(e.code)) == "zone":
                continue
            raise ProvisioningError(f"aws: the gateway's VM: {e}", launch.failure_kind(e.code)) from None
        return client, str(reply["Instances"][0]["InstanceId"])
    raise ProvisioningError(f"aws: no zone of {spec.region} could launch the gateway's VM: {'; '.join(errors)}")


def address_of(described: dict[str, Any], public_ip: bool) -> str | None:
    """Where a gateway on the VM answers: its public IP, or its private one for a private gateway."""
    if public_ip:
        return described.get("PublicIpAddress") or None
    return described.get("PrivateIpAddress") or None


async def running(session: AWSSession, client: Any, ec2_id: str) -> dict[str, Any]:
    """The VM as DescribeInstances says once it runs (raises when it stops on the way, or takes too long)."""
    deadline = time.monotonic() + session.provisioning_timeout
    while True:
        described = await session.ec2(ec2.state, client, ec2_id)
        state = ((described or {}).get("State") or {}).get("Name")
        if state == "running" and described is not None:
            return dict(described)
        if state in ("shutting-down", "terminated", "stopping", "stopped"):
            raise ProvisioningError(f"the gateway's EC2 instance {ec2_id} is {state} before it ran")
        if time.monotonic() > deadline:
            raise ProvisioningError(f"the gateway's EC2 instance {ec2_id} did not reach running in time")
        await asyncio.sleep(session.poll)


async def create(session: AWSSession, spec: GatewaySpec) -> GatewayHost:
    """The gateway's VM launched (or adopted) and running: its address, and how the server logs into it."""
    if not spec.region:
        raise ProvisioningError("an aws gateway needs its region (`region`)", "refused")
    client, ec2_id = await launch_vm(session, spec)
    described = await running(session, client, ec2_id)
    project = await session.project(spec.project_name)
    address = address_of(described, spec.public_ip)
    if address is None:
        which = "public" if spec.public_ip else "private"
        raise ProvisioningError(f"the gateway's EC2 instance {ec2_id} has no {which} IP address")
    # the server logs in as the instances' login does: the public IP unless the backend says public_ips: false
    inside = project.config.get("public_ips") is False or not spec.public_ip
    ssh_host = described.get("PrivateIpAddress") if inside else address
    connection = {
        "host": ssh_host, "port": 22, "user": "root", "private_key": spec.private_key, "proxy_jump": None,
        "aws": {"instance_id": ec2_id, "region": spec.region, "project": project.name, "public_ip": spec.public_ip},
    }  # fmt: skip
    return GatewayHost(address=address, connection=connection)


async def address(session: AWSSession, host: GatewayHost) -> str:
    """The VM's address now (a stopped and started VM has a new public IP)."""
    where = host.connection["aws"]
    project = await session.project(str(where["project"]))
    client = await session.ec2(ec2.client, project.creds, str(where["region"]))
    described = await session.ec2(ec2.state, client, str(where["instance_id"]))
    return address_of(described or {}, where.get("public_ip") is not False) or host.address


async def terminate(session: AWSSession, spec: GatewaySpec, host: GatewayHost) -> None:
    """TerminateInstances of the gateway's VM (the one stored, and any other tagged with the gateway's id),
    confirmed by DescribeInstances before it returns (raises otherwise: the worker tries again)."""
    project = await session.project(spec.project_name)
    client = await session.ec2(ec2.client, project.creds, spec.region)
    ids = {str(i["InstanceId"]) for i in await session.ec2(ec2.by_tag, client, launch.TAG_INSTANCE, spec.gateway_id)}
    if host.connection.get("aws"):
        ids.add(str(host.connection["aws"]["instance_id"]))
    for ec2_id in sorted(ids):
        await session.ec2(ec2.terminate, client, ec2_id)
    deadline = time.monotonic() + session.terminate_timeout
    for ec2_id in sorted(ids):
        while True:
            described = await session.ec2(ec2.state, client, ec2_id)
            state = ((described or {}).get("State") or {}).get("Name")
            if described is None or state == "terminated":
                break
            if time.monotonic() >= deadline:
                raise ProvisioningError(f"the gateway's EC2 instance {ec2_id} is {state}, not terminated")
            await asyncio.sleep(session.poll)
