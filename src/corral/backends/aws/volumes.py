"""EBS volumes through EC2 (dstack's calls and error handling): CreateVolume (gp3, tagged, in the configured
zone or the region's first), DescribeVolumes to register an existing one, AttachVolume on the first free
``/dev/sdf``...``/dev/sdn``, DetachVolume (forced only when a normal detach did not finish in time) and
DeleteVolume, each tolerating what dstack tolerates. Blocking, as ``ec2``'s calls: callers run them in a thread.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from corral.backends.aws import ec2
from corral.domain.volumes import DEVICE_NAMES, price

log = logging.getLogger("corral.volumes")


def _provisioning(v: dict[str, Any]) -> dict[str, Any]:
    """dstack's ``VolumeProvisioningData`` of an EC2 volume."""
    size = int(v.get("Size") or 0)
    return {
        "backend": "aws",
        "volume_id": str(v["VolumeId"]),
        "size_gb": size,
        "availability_zone": str(v.get("AvailabilityZone") or ""),
        "price": price(size, int(v.get("Iops") or 3000)),
        "attachable": True,
        "detachable": True,
        "backend_data": None,
    }


#: DescribeAvailabilityZones' ``ZoneType`` of a region's own zones; Local Zones (``local-zone``, named like
#: ``us-east-1-atl-2a``) and Wavelength Zones are other types (EC2 API reference, AvailabilityZone ``zoneType``).
AVAILABILITY_ZONE = "availability-zone"


def pick_zone(zones: list[dict[str, Any]]) -> str | None:
    """The first (by name) available zone of the region itself among DescribeAvailabilityZones' ``zones``: never
    a Local Zone, which sorts before them (``us-east-1-atl-2a`` < ``us-east-1a``)."""
    names = sorted(
        str(z["ZoneName"])
        for z in zones
        if z.get("State", "available") == "available" and z.get("ZoneType", AVAILABILITY_ZONE) == AVAILABILITY_ZONE
    )
    return names[0] if names else None


def first_zone(client: Any) -> str:
    zone = pick_zone(ec2.call(client, "describe_availability_zones")["AvailabilityZones"])
    if zone is None:
        raise ec2.AWSError("", "the region has no available zone")
    return zone


def create(client: Any, conf: dict[str, Any], size_gib: int, tags: dict[str, str]) -> dict[str, Any]:
    zone = str(conf.get("availability_zone") or "") or first_zone(client)
    reply = ec2.call(
        client,
        "create_volume",
        Size=size_gib,
        AvailabilityZone=zone,
        VolumeType="gp3",
        TagSpecifications=[{"ResourceType": "volume", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
    )
    return _provisioning(reply)


def register(client: Any, volume_id: str) -> dict[str, Any]:
    """The provisioning data of the existing ``volume_id``; ``AWSError`` naming it when EC2 has none."""
    try:
        found = ec2.call(client, "describe_volumes", VolumeIds=[volume_id])["Volumes"]
    except ec2.AWSError as e:
        if e.code in ("InvalidVolume.NotFound", "InvalidVolumeID.Malformed", "InvalidParameterValue"):
            raise ec2.AWSError(e.code, f"no EBS volume {volume_id} in this region (volume_id)") from None
        raise
    if not found:
        raise ec2.AWSError("InvalidVolume.NotFound", f"no EBS volume {volume_id} in this region (volume_id)")
    return _provisioning(found[0])


def attach(client: Any, volume_id: str, instance_id: str, taken: set[str]) -> str:
    """AttachVolume on the first device name not in ``taken`` that EC2 accepts: the device name used."""
    for device in DEVICE_NAMES:
        if device in taken:
            continue
        try:
            ec2.call(client, "attach_volume", VolumeId=volume_id, InstanceId=instance_id, Device=device)
        except ec2.AWSError as e:
            if e.code == "InvalidParameterValue" and "device" in str(e).lower():
                continue  # taken on the instance
            raise
        return device
    raise ec2.AWSError("", f"no free device name on {instance_id} for {volume_id}")


def state(client: Any, volume_id: str, instance_id: str) -> str:
    """The attachment's state (``attaching``, ``attached``, ``detaching``, ``detached``; absent: detached)."""
    try:
        found = ec2.call(client, "describe_volumes", VolumeIds=[volume_id])["Volumes"]
    except ec2.AWSError as e:
        if e.code == "InvalidVolume.NotFound":
            return "detached"
        raise
    for a in (found[0].get("Attachments") or []) if found else []:
        if a.get("InstanceId") == instance_id:
            return str(a.get("State") or "attached")
    return "detached"


def _detach(client: Any, volume_id: str, instance_id: str, device: str, force: bool) -> None:
    try:
        ec2.call(client, "detach_volume", VolumeId=volume_id, InstanceId=instance_id, Device=device, Force=force)
    except ec2.AWSError as e:  # dstack's IncorrectState; moto answers InvalidAttachment.NotFound
        if e.code not in ("IncorrectState", "InvalidAttachment.NotFound", "InvalidVolume.NotFound"):
            raise


def _detached(client: Any, volume_id: str, instance_id: str, wait: float, poll: float) -> bool:
    deadline = time.monotonic() + wait
    while state(client, volume_id, instance_id) != "detached":
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


def detach(client: Any, volume_id: str, instance_id: str, device: str, wait: float, poll: float) -> bool:
    """DetachVolume, then wait up to ``wait`` seconds for EC2 to say detached; only when it has not, forced
    (a forced detach "can lead to data loss or a corrupted file system. Use this option only as a last
    resort": EC2 API reference, DetachVolume ``Force``) and waited for again. Whether it is detached."""
    _detach(client, volume_id, instance_id, device, force=False)
    if _detached(client, volume_id, instance_id, wait, poll):
        return True
    log.warning("volume %s: not detached from %s after %gs; forcing the detach", volume_id, instance_id, wait)
    _detach(client, volume_id, instance_id, device, force=True)
    return _detached(client, volume_id, instance_id, wait, poll)


def delete(client: Any, volume_id: str) -> None:
    try:
        ec2.call(client, "delete_volume", VolumeId=volume_id)
    except ec2.AWSError as e:
        if e.code != "InvalidVolume.NotFound":
            raise
