"""EBS volumes' EC2 rules: the zone a new volume goes to when none is configured (never a Local Zone), and
DetachVolume against moto, through the fault proxy: a volume is detached normally, and forced only as the
last resort AWS says it is (a normal detach that did not finish in time)."""

from __future__ import annotations

from collections.abc import Iterator

import facts
import pytest
from moto_harness import AMIS, REGION, FaultProxy, MotoEC2, fault_proxy

from corral.backends.aws import ec2
from corral.backends.aws import volumes as ebs


@pytest.fixture
def proxy(moto: MotoEC2) -> Iterator[FaultProxy]:
    with fault_proxy(moto) as fp:
        yield fp


@pytest.fixture
def attached(moto: MotoEC2) -> Iterator[tuple[str, str]]:
    """An instance and a volume attached to it at /dev/sdf, made directly in moto (both gone afterwards: other
    tests wait for every instance to end)."""
    iid, vid = _attach(moto)
    yield iid, vid
    c = moto.client()
    c.terminate_instances(InstanceIds=[iid])
    c.delete_volume(VolumeId=vid)


def _attach(moto: MotoEC2) -> tuple[str, str]:
    c = moto.client()
    instance = c.run_instances(ImageId=AMIS[0]["ami_id"], InstanceType="m7i.large", MinCount=1, MaxCount=1)
    iid = instance["Instances"][0]["InstanceId"]
    zone = instance["Instances"][0]["Placement"]["AvailabilityZone"]
    vid = c.create_volume(Size=1, AvailabilityZone=zone, VolumeType="gp3")["VolumeId"]
    c.attach_volume(VolumeId=vid, InstanceId=iid, Device="/dev/sdf")
    return iid, vid


def _forces(proxy: FaultProxy, vid: str) -> list[str]:
    return [(form.get("Force") or [""])[0] for action, form in proxy.requests
            if action == "DetachVolume" and form.get("VolumeId") == [vid]]  # fmt: skip


def test_a_volume_is_detached_without_force(moto: MotoEC2, proxy: FaultProxy, attached: tuple[str, str]) -> None:
    iid, vid = attached
    client = ec2.client(ec2.Creds("testing", "testing"), REGION)
    assert ebs.detach(client, vid, iid, "/dev/sdf", wait=5.0, poll=0.05)
    assert _forces(proxy, vid) == ["false"]
    assert not moto.client().describe_volumes(VolumeIds=[vid])["Volumes"][0]["Attachments"]


def test_a_detach_that_does_not_finish_is_forced_as_a_last_resort(proxy: FaultProxy, attached: tuple[str, str]) -> None:
    iid, vid = attached
    # EC2 takes the normal detach and never finishes it (a volume still busy on the instance)
    proxy.swallow_when = lambda action, form: action == "DetachVolume" and form.get("Force") != ["true"]
    client = ec2.client(ec2.Creds("testing", "testing"), REGION)
    assert ebs.detach(client, vid, iid, "/dev/sdf", wait=0.3, poll=0.05)
    assert _forces(proxy, vid) == ["false", "true"]


def test_a_new_volume_never_goes_to_a_local_zone() -> None:
    zones = [
        {"ZoneName": facts.LOCAL_ZONE_NAME, "State": "available", "ZoneType": "local-zone"},
        {"ZoneName": "us-east-1b", "State": "available", "ZoneType": facts.ZONE_TYPE_AZ},
        {"ZoneName": "us-east-1a", "State": "impaired", "ZoneType": facts.ZONE_TYPE_AZ},
    ]
    assert facts.LOCAL_ZONE_NAME < "us-east-1a"  # by name it would come first
    assert ebs.pick_zone(zones) == "us-east-1b"
    assert ebs.pick_zone(zones[:1]) is None


def test_the_first_zone_of_moto_is_one_of_the_regions_own(moto: MotoEC2) -> None:
    assert ebs.first_zone(moto.client()) == f"{REGION}a"
