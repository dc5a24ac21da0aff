"""The EC2 calls of the AWS backend, through boto3 (imported on first use, never on the server's start
path). Blocking: the compute runs each in a thread. boto3's own ``AWS_ENDPOINT_URL`` (or
``AWS_ENDPOINT_URL_EC2``) points it at another endpoint; corral adds no knob of its own.

RunInstances is made once per attempt (no botocore retries: capacity errors are answered by trying the next
zone, never by repeating the same call); other calls use botocore's standard retries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corral.backends.aws.launch import TAG_INSTANCE, TAG_SERVER
from corral.backends.aws.orphans import LIVE_STATES, Tagged

#: Ubuntu 22.04, owner Canonical (terraform-provider-aws docs, r/instance: ``owners = ["099720109477"] # Canonical``).
UBUNTU = ("ubuntu/images/hvm-ssd*/ubuntu-jammy-22.04-amd64-server-*", "099720109477")
#: The Deep Learning Base GPU AMI, owner Amazon (dstack's aws/resources.py ``DLAMI_OWNER_ACCOUNT_ID``).
DLAMI = ("Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *", "898082745236")


class AWSError(Exception):
    """An EC2 call failed: ``code`` is EC2's error code (empty when it is not an EC2 error)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.code = code


@dataclass(frozen=True)
class Creds:
    access_key: str | None = None
    secret_key: str | None = None


def _error(e: Exception) -> AWSError:
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(e, ClientError):
        err = e.response.get("Error", {})
        return AWSError(str(err.get("Code") or ""), str(err.get("Message") or e))
    if isinstance(e, BotoCoreError):
        return AWSError("", str(e))
    raise e


def client(creds: Creds, region: str, service: str = "ec2", once: bool = False) -> Any:
    import boto3
    from botocore.config import Config

    session = boto3.session.Session(
        aws_access_key_id=creds.access_key, aws_secret_access_key=creds.secret_key, region_name=region
    )
    # ``total_max_attempts`` counts the first call (botocore's ``max_attempts`` counts retries only)
    retries = {"total_max_attempts": 1 if once else 3, "mode": "standard"}
    return session.client(service, config=Config(retries=retries, connect_timeout=10, read_timeout=30))  # type: ignore[arg-type]


def check_creds(creds: Creds, region: str) -> str:
    """The account the credentials belong to (STS GetCallerIdentity); ``AWSError`` when they do not work."""
    try:
        return str(client(creds, region, "sts").get_caller_identity()["Account"])
    except Exception as e:
        raise _error(e) from None


def call(ec2: Any, op: str, **params: Any) -> Any:
    try:
        return getattr(ec2, op)(**params)
    except Exception as e:
        raise _error(e) from None


@dataclass(frozen=True)
class VPC:
    """The VPC launches go to in a region, and whether it is the region's default one (chosen by corral) or a
    custom one the configuration names (``vpc_ids``, ``vpc_name``): only a custom VPC's subnets are checked."""

    vpc_id: str
    default: bool
    #: The configuration field that named it (``vpc_ids``, ``vpc_name``; ``default_vpcs`` for the default VPC).
    field: str


def vpc(ec2: Any, region: str, conf: dict[str, Any]) -> VPC:
    """The VPC to launch in: ``vpc_ids[region]``, else the one tagged ``Name=vpc_name``, else (unless
    ``default_vpcs: false``) the region's default VPC."""
    ids = conf.get("vpc_ids") or {}
    if region in ids:
        return VPC(str(ids[region]), False, "vpc_ids")
    if conf.get("vpc_name"):
        vpcs = call(ec2, "describe_vpcs", Filters=[{"Name": "tag:Name", "Values": [conf["vpc_name"]]}])["Vpcs"]
        if not vpcs:
            raise AWSError("", f"no VPC named {conf['vpc_name']!r} in {region} (vpc_name)")
        return VPC(str(vpcs[0]["VpcId"]), False, "vpc_name")
    if conf.get("default_vpcs") is False:
        raise AWSError("", f"no VPC for {region}: add it to vpc_ids, or allow default_vpcs")
    vpcs = call(ec2, "describe_vpcs", Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
    if not vpcs:
        raise AWSError("", f"{region} has no default VPC: set vpc_name or vpc_ids")
    return VPC(str(vpcs[0]["VpcId"]), True, "default_vpcs")


def _route_table(subnet_id: str, tables: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The route table a subnet uses: the one associated with it, else its VPC's main table."""
    for want in ("SubnetId", "Main"):
        for t in tables:
            for a in t.get("Associations") or []:
                if (a.get("SubnetId") == subnet_id) if want == "SubnetId" else a.get("Main"):
                    return t
    return None


def reaches_out(table: dict[str, Any] | None, public_ips: bool) -> bool:
    """Whether a subnet with route ``table`` suits instances with (``public_ips``) or without public IPs, as
    dstack decides it: public subnets route to an internet gateway (``igw-``); private ones send 0.0.0.0/0 to a
    NAT gateway, a transit gateway or a peering connection (their only way out)."""
    routes = (table or {}).get("Routes") or []
    if public_ips:
        return any(str(r.get("GatewayId") or "").startswith("igw-") for r in routes)
    return any(
        r.get("DestinationCidrBlock") == "0.0.0.0/0"
        and (r.get("NatGatewayId") or r.get("TransitGatewayId") or r.get("VpcPeeringConnectionId"))
        for r in routes
    )


def usable_subnets(
    subnets: list[dict[str, Any]], tables: list[dict[str, Any]], public_ips: bool | None
) -> dict[str, str]:
    """One subnet per availability zone (the first usable by id), zones in name order: every subnet when
    ``public_ips`` is None (the default VPC: its subnets are public), else those whose route table
    :func:`reaches_out`."""
    zones: dict[str, str] = {}
    for s in sorted(subnets, key=lambda s: (s["AvailabilityZone"], s["SubnetId"])):
        sid = str(s["SubnetId"])
        if public_ips is None or reaches_out(_route_table(sid, tables), public_ips):
            zones.setdefault(str(s["AvailabilityZone"]), sid)
    return zones


def subnets_by_zone(ec2: Any, where: VPC, public_ips: bool) -> dict[str, str]:
    """The subnets launches in ``where`` use, one per zone (:func:`usable_subnets`; a custom VPC's by route)."""
    vpc_filter = [{"Name": "vpc-id", "Values": [where.vpc_id]}]
    found = call(ec2, "describe_subnets", Filters=vpc_filter)["Subnets"]
    if where.default:
        return usable_subnets(found, [], None)
    tables = call(ec2, "describe_route_tables", Filters=vpc_filter)["RouteTables"]
    return usable_subnets(found, tables, public_ips)


def no_subnet(where: VPC, region: str, public_ips: bool) -> str:
    """Why a region has no subnet to launch in: the message names the fields to change."""
    if public_ips:
        return (
            f"no subnet of VPC {where.vpc_id} in {region} ({where.field}) routes to an internet gateway, as "
            "instances with public IPs need: add an igw- route to a subnet's route table, or set public_ips: false"
        )
    return (
        f"no subnet of VPC {where.vpc_id} in {region} ({where.field}) routes 0.0.0.0/0 to a NAT gateway, a "
        "transit gateway or a peering connection, as instances without public IPs (public_ips: false) need to "
        "reach the internet: add such a route, or set public_ips: true"
    )


def security_group(ec2: Any, vpc: str, project: str, tags: dict[str, str] | None = None) -> str:
    """The project's security group in ``vpc`` (made on first use, tagged with the backend's ``tags`` and
    corral's): SSH in, everything within the group."""
    name = f"corral_{project}"
    found = call(
        ec2,
        "describe_security_groups",
        Filters=[{"Name": "group-name", "Values": [name]}, {"Name": "vpc-id", "Values": [vpc]}],
    )["SecurityGroups"]
    if found:
        return str(found[0]["GroupId"])
    try:
        group = _create_group(ec2, vpc, project, name, tags or {})
    except AWSError as e:  # another launch made it meanwhile
        if e.code != "InvalidGroup.Duplicate":
            raise
        return security_group(ec2, vpc, project, tags)
    rules = [
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]},
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group}]},
    ]
    try:
        call(ec2, "authorize_security_group_ingress", GroupId=group, IpPermissions=rules)
    except AWSError as e:
        if e.code != "InvalidPermission.Duplicate":
            raise
    return group


def _create_group(ec2: Any, vpc: str, project: str, name: str, tags: dict[str, str]) -> str:
    own = [{"Key": "owner", "Value": "corral"}, {"Key": "corral_project", "Value": project}]
    return str(
        call(
            ec2,
            "create_security_group",
            GroupName=name,
            Description=f"corral project {project}",
            VpcId=vpc,
            TagSpecifications=[
                {
                    "ResourceType": "security-group",
                    "Tags": [{"Key": k, "Value": v} for k, v in tags.items() if k not in ("owner", "corral_project")]
                    + own,
                }
            ],
        )["GroupId"]
    )


@dataclass(frozen=True)
class Image:
    """An AMI to launch: its id, the user it logs in as, and its root device (DescribeImages'
    ``RootDeviceName``: ``/dev/sda1`` on Ubuntu, ``/dev/xvda`` on Amazon Linux), which the launch's 100 GB root
    volume must name to grow the root disk rather than add a second one."""

    image_id: str
    user: str
    root_device: str = "/dev/sda1"


def image(ec2: Any, conf: dict[str, Any], gpu: bool) -> Image:
    """The newest available AMI for the instance (``os_images`` if set)."""
    custom = (conf.get("os_images") or {}).get("nvidia" if gpu else "cpu")
    name, owner = (custom["name"], custom.get("owner") or "self") if custom else (DLAMI if gpu else UBUNTU)
    user = custom["user"] if custom else "ubuntu"
    found = call(
        ec2,
        "describe_images",
        Filters=[{"Name": "name", "Values": [name]}, {"Name": "state", "Values": ["available"]}],
        Owners=[owner],
    )["Images"]
    if not found:
        raise AWSError("InvalidAMIID.NotFound", f"no AMI named {name!r} of owner {owner} (os_images)")
    newest = max(found, key=lambda i: str(i.get("CreationDate") or ""))
    return Image(str(newest["ImageId"]), str(user), str(newest.get("RootDeviceName") or "/dev/sda1"))


def by_tag(ec2: Any, key: str, value: str, states: tuple[str, ...] = LIVE_STATES) -> list[dict[str, Any]]:
    pages = call(
        ec2,
        "describe_instances",
        Filters=[{"Name": f"tag:{key}", "Values": [value]}, {"Name": "instance-state-name", "Values": list(states)}],
    )
    return [i for r in pages.get("Reservations", []) for i in r.get("Instances", [])]


def owned(ec2: Any, server_id: str) -> list[Tagged]:
    """Live instances tagged with this server's id."""
    out = []
    for i in by_tag(ec2, TAG_SERVER, server_id, ("pending", "running", "stopping", "stopped", "shutting-down")):
        tags = {t["Key"]: t["Value"] for t in i.get("Tags") or []}
        launched = i.get("LaunchTime")
        out.append(
            Tagged(
                str(i["InstanceId"]),
                tags.get(TAG_INSTANCE, ""),
                str(i["State"]["Name"]),
                launched.timestamp() if launched else 0.0,
            )
        )
    return out


def state(ec2: Any, instance_id: str) -> dict[str, Any] | None:
    """The instance as DescribeInstances sees it; None when EC2 does not know it (yet)."""
    try:
        found = call(ec2, "describe_instances", InstanceIds=[instance_id])
    except AWSError as e:
        if e.code == "InvalidInstanceID.NotFound":
            return None
        raise
    items = [i for r in found.get("Reservations", []) for i in r.get("Instances", [])]
    return items[0] if items else None


def described(ec2: Any, instance_ids: list[str]) -> list[dict[str, Any]]:
    """The instances of ``instance_ids`` that DescribeInstances lists (unknown ids are left out, not an error)."""
    out: list[dict[str, Any]] = []
    for start in range(0, len(instance_ids), 200):  # EC2's limit of filter values
        found = call(
            ec2, "describe_instances", Filters=[{"Name": "instance-id", "Values": instance_ids[start : start + 200]}]
        )
        out.extend(i for r in found.get("Reservations", []) for i in r.get("Instances", []))
    return out


def terminate(ec2: Any, instance_id: str) -> None:
    try:
        call(ec2, "terminate_instances", InstanceIds=[instance_id])
    except AWSError as e:
        if e.code != "InvalidInstanceID.NotFound":
            raise
