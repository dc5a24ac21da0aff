"""Pure rules of an EC2 launch: the tags that name an instance's owner, the ``ClientToken`` of an attempt,
the UserData script, a RunInstances call's parameters, how its error is classified, and the short cache of
unavailable offerings.

No boto3, no clocks (``now`` is a parameter).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Literal

from corral.domain import aws_tags
from corral.domain.provisioning import FailureKind

#: Tag keys corral writes on every instance (and reads back: adoption, the reaper): ``domain.aws_tags``.
TAG_SERVER = aws_tags.TAG_SERVER
TAG_PROJECT = aws_tags.TAG_PROJECT
TAG_FLEET = aws_tags.TAG_FLEET
TAG_INSTANCE = aws_tags.TAG_INSTANCE
TAG_GANG = aws_tags.TAG_GANG
TAG_PLACEMENT = aws_tags.TAG_PLACEMENT
OWNER = aws_tags.OWNER
#: EC2's limit on UserData (before base64).
USER_DATA_LIMIT = 16 * 1024
#: How long a (region, zone, type) that answered "insufficient capacity", or a region whose quota was
#: reached, is not tried again (``CORRAL_AWS_UNAVAILABLE_TTL``).
UNAVAILABLE_TTL = 120.0
#: RunInstances calls one reservation may make, over all its offers and zones (no retry storm).
MAX_LAUNCH_ATTEMPTS = 6

#: RunInstances' ``InstanceMarketOptions`` of a spot offer: a one-time request, the instance terminated when
#: EC2 reclaims it (dstack's; no ``MaxPrice``: at most the on-demand price).
SPOT_MARKET = {
    "MarketType": "spot",
    "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
}

Verdict = Literal["capacity", "quota", "invalid", "transient", "wait", "other"]

# EC2's error codes (AWS "Error codes for the Amazon EC2 API", errors-overview.html):
#: no room for the offer in this zone (or this reservation): another zone or offer may have some.
_CAPACITY = {"InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
             "InsufficientReservedInstanceCapacity", "InsufficientCapacityOnHost", "Unsupported",
             "SpotMaxPriceTooLow", "ReservationCapacityExceeded"}  # fmt: skip
#: the account's quota of a market (on-demand, spot) and family group in the region, not the whole region's.
_QUOTA = {"InstanceLimitExceeded", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded"}
#: EC2's own trouble, or a full subnet (per zone: another zone's subnet will do).
_TRANSIENT = {"RequestLimitExceeded", "InternalError", "Unavailable", "ServiceUnavailable", "Throttling",
              "ServerInternal", "InternalFailure", "InsufficientAddressCapacity",
              "InsufficientFreeAddressesInSubnet"}  # fmt: skip
#: a Capacity Block that is not active yet: the launch waits for it.
_WAIT = {"InvalidCapacityReservationState.PendingActivation"}
#: refusals of the offer's own parameters (another offer may be fine); other ``Invalid*`` codes are the
#: configuration's (its image, subnet, security group...) and stop the launch with their reason.
_INVALID = ("InvalidParameter", "InvalidInstanceType", "InvalidBlockDeviceMapping")


def classify(code: str) -> Verdict:
    """What a RunInstances error code means for the next try: another zone or offer (``capacity``,
    ``transient``), no offer of the same market and quota group in the region (``quota``), skip this offer
    (``invalid``), the reservation is not active yet (``wait``), or nothing else will do better (``other``:
    credentials, permissions, the configuration's image, subnet or security group)."""
    if code in _CAPACITY:
        return "capacity"
    if code in _TRANSIENT:
        return "transient"
    if code in _QUOTA:
        return "quota"
    if code in _WAIT:
        return "wait"
    if code.startswith(_INVALID):
        return "invalid"
    return "other"


#: EC2 codes of credentials or permissions refused (AWS "Error codes for the Amazon EC2 API": common client errors).
_CREDENTIALS = {"AuthFailure", "UnauthorizedOperation", "InvalidClientTokenId", "SignatureDoesNotMatch",
                "OptInRequired", "Blocked", "PendingVerification"}  # fmt: skip


def failure_kind(code: str) -> FailureKind:
    """What an EC2 error code says to the user about a launch that failed (``domain.provisioning``)."""
    verdict = classify(code)
    if verdict in ("capacity", "transient", "wait"):
        return "no_capacity"
    if verdict == "quota":
        return "quota"
    if code.startswith("InvalidAMI"):
        return "image"
    if code.startswith(("InvalidSubnet", "InvalidGroup", "InvalidSecurityGroup", "InvalidVpc")):
        return "network"
    if code in _CREDENTIALS:
        return "credentials"
    return "refused"


def quota_group(instance_type: str) -> str:
    """The on-demand and spot quota group of ``instance_type``'s family (EC2 User Guide, "On-Demand Instance
    quotas": Standard (A, C, D, H, I, M, R, T, Z), F, G and VT, Inf, P, Trn, X, DL, HPC): the letters that
    start its family name, ``standard`` for the standard families."""
    family = instance_type.split(".", 1)[0].lower()
    for group in ("inf", "trn", "dl", "hpc", "vt", "f", "g", "p", "x"):
        if family.startswith(group):
            return "g" if group == "vt" else group
    return "standard"


def quota_key(instance_type: str, spot: bool) -> str:
    """What a quota error blocks: the market (spot or on-demand) and the family's quota group."""
    return f"quota/{quota_group(instance_type)}/{'spot' if spot else 'on-demand'}"


def market_key(instance_type: str, spot: bool) -> str:
    """The instance type as the cache of unavailable offerings keys it: spot capacity is not on-demand's."""
    return f"{instance_type}/spot" if spot else instance_type


def client_token(instance_id: str, attempt: int) -> str:
    """``corral-<row id>-<n>``: a new ``n`` per offer or zone tried (at most 64 characters)."""
    token = f"corral-{instance_id}-{attempt}"
    if len(token) > 64:
        raise ValueError(f"client token {token!r} is longer than EC2's 64 characters")
    return token


_TAG_BAD = re.compile(r"[^\w .:/=+\-@]")


def instance_tags(
    server_id: str, project: str, fleet: str | None, instance_id: str, name: str, extra: dict[str, str] | None
) -> list[dict[str, str]]:
    """The instance's tags: the admin's and the fleet's ``tags`` first, then corral's (which they cannot
    override)."""
    tags = {k: _TAG_BAD.sub("_", v)[: aws_tags.VALUE_LIMIT] for k, v in (extra or {}).items()}
    tags.update(
        {
            aws_tags.NAME: aws_tags.name_tag(project, name),
            OWNER[0]: OWNER[1],
            TAG_SERVER: server_id,
            TAG_PROJECT: project,
            TAG_FLEET: fleet or "",
            TAG_INSTANCE: instance_id,
        }
    )
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def user_data(public_keys: list[str]) -> str:
    """A ``#!/bin/sh`` script (cloud-init runs it as root) that authorises ``public_keys`` for root; the
    server then logs in over SSH and starts its agent, which needs only ``python3`` on the image."""
    keys = "\n".join(k.strip() for k in public_keys if k.strip())
    script = (
        "#!/bin/sh\n"
        "# corral: authorise the project's key for root; the server installs its agent over SSH\n"
        "set -e\n"
        "umask 077\n"
        "mkdir -p /root/.ssh\n"
        f"printf '%s\\n' {shlex.quote(keys)} >> /root/.ssh/authorized_keys\n"
        "chmod 600 /root/.ssh/authorized_keys\n"
        "command -v python3 >/dev/null || echo 'corral: python3 is missing on this image' >&2\n"
    )
    if len(script.encode()) > USER_DATA_LIMIT:
        raise ValueError(f"the user data is {len(script.encode())} bytes; EC2 takes at most {USER_DATA_LIMIT}")
    return script


@dataclass(frozen=True)
class LaunchSpec:
    """What a RunInstances call launches (one offer, ``count`` instances alike) and with what: the parameters of
    a single instance's launch and of a gang's are built from it by :func:`run_params`."""

    image: str
    instance_type: str
    spot: bool
    security_group: str
    tags: list[dict[str, str]]
    public_key: str
    public_ip: bool = True
    iam_instance_profile: str | None = None
    #: The image's root device: the root volume's ``DeviceName`` (``ec2.Image.root_device``).
    root_device: str = "/dev/sda1"
    #: Further parameters (a capacity reservation's target, a placement group).
    extra: dict[str, Any] = field(default_factory=dict)


def run_params(spec: LaunchSpec, subnet: str, count: int, token: str, disk_gib: int) -> dict[str, Any]:
    """RunInstances' parameters (botocore's ``RunInstances`` input shape): ``count`` instances, all or none
    (``MinCount = MaxCount``), the root volume ``disk_gib`` GiB of gp3, one network interface in ``subnet`` with
    the security group, a public address unless the project says ``public_ips: false``, and a one-time spot
    request for a spot offer (:data:`SPOT_MARKET`)."""
    params: dict[str, Any] = {
        "ImageId": spec.image,
        "InstanceType": spec.instance_type,
        "MinCount": count,
        "MaxCount": count,
        "ClientToken": token,
        "UserData": user_data([spec.public_key]),
        "BlockDeviceMappings": [{"DeviceName": spec.root_device, "Ebs": {"VolumeSize": disk_gib, "VolumeType": "gp3"}}],
        # the root volume is tagged as its instance is (it is made for it)
        "TagSpecifications": [{"ResourceType": t, "Tags": spec.tags} for t in ("instance", "volume")],
        "NetworkInterfaces": [
            {"DeviceIndex": 0, "SubnetId": subnet, "Groups": [spec.security_group],
             "AssociatePublicIpAddress": spec.public_ip}
        ],
        **spec.extra,
    }  # fmt: skip
    if spec.spot:  # one-time, terminated on interruption (dstack's; no MaxPrice)
        params["InstanceMarketOptions"] = SPOT_MARKET
    if spec.iam_instance_profile:
        params["IamInstanceProfile"] = {"Name": spec.iam_instance_profile}
    return params


def next_move(verdict: Verdict) -> Literal["zone", "offer", "stop"]:
    """Where a launch goes after a RunInstances error: the next zone of the same offer (no capacity there,
    or a transient error), the next offer (this one's parameters are refused, or its market and quota group
    are at their quota in the region: an offer of another group, market or region may launch), or nowhere
    (anything else: credentials, permissions, the configuration's image or network, a reservation to wait
    for)."""
    if verdict in ("capacity", "transient"):
        return "zone"
    if verdict in ("invalid", "quota"):
        return "offer"
    return "stop"


@dataclass
class Unavailable:
    """What failed lately, until when: offerings (region, zone, instance type) that answered "insufficient
    capacity", and quota groups of a market (:func:`quota_key`) whose quota was reached in a region."""

    ttl: float = UNAVAILABLE_TTL
    _until: dict[tuple[str, ...], float] = field(default_factory=dict)

    def mark(self, region: str, zone: str, instance_type: str, now: float) -> None:
        self._until[(region, zone, instance_type)] = now + self.ttl

    def mark_quota(self, region: str, instance_type: str, spot: bool, now: float) -> None:
        self._until[(region, quota_key(instance_type, spot))] = now + self.ttl

    def quota_blocked(self, region: str, instance_type: str, spot: bool, now: float) -> bool:
        return self._live((region, quota_key(instance_type, spot)), now)

    def blocked(self, region: str, zone: str, instance_type: str, now: float) -> bool:
        """Whether the offering (``instance_type`` as :func:`market_key` writes it) had no capacity lately."""
        return self._live((region, zone, instance_type), now)

    def _live(self, key: tuple[str, ...], now: float) -> bool:
        until = self._until.get(key)
        if until is None:
            return False
        if until <= now:
            del self._until[key]
            return False
        return True


def in_zone(zones: dict[str, str], zone: str, allowed: frozenset[str] | None = None) -> dict[str, str]:
    """The subnets by zone a launch tries: only ``zone``'s when the offer is pinned to one (a job's
    volumes are there), else all; and of those only the ``allowed`` ones (a fleet's ``availability_zones``)."""
    picked = {z: s for z, s in zones.items() if z == zone} if zone else zones
    return picked if allowed is None else {z: s for z, s in picked.items() if z in allowed}
