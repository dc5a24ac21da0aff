"""The pure rules of network volumes: which entries of ``volumes`` are network volumes, what the volumes
worker does next, why a deletion is refused, the device names, where a job using volumes must run."""

from __future__ import annotations

import dataclasses

import pytest

from corral.domain.volumes import (
    VolumeRec,
    chosen,
    free_device,
    mount_points,
    next_step,
    placements,
    price,
    refuse_delete,
    volume_names,
)

V = VolumeRec(
    id="v", project_id="p", project_name="main", user_name="admin", name="data", status="submitted",
    status_message=None, configuration={"backend": "aws", "region": "us-east-1", "size": 10}, provisioning=None,
    instance_id=None, attachment=None, to_be_deleted=False, deleted=False, created_at=0.0, deleted_at=None,
    last_processed_at=0.0,
)  # fmt: skip


def test_mount_points_leave_instance_volumes_out_and_keep_alternatives() -> None:
    conf = {"volumes": ["data:/data", "/host/cache:/cache", {"name": "ckpt", "path": "/ckpt"},
                        {"name": ["a", "b"], "path": "/ab"}, {"instance_path": "/x", "path": "/y"}]}  # fmt: skip
    assert mount_points(conf) == [(("data",), "/data"), (("ckpt",), "/ckpt"), (("a", "b"), "/ab")]
    assert mount_points({}) == []


def test_next_step_and_deletion() -> None:
    assert next_step(V) == "create"
    assert next_step(dataclasses.replace(V, configuration={**V.configuration, "volume_id": "vol-1"})) == "register"
    active = dataclasses.replace(V, status="active")
    assert next_step(active) is None
    assert next_step(dataclasses.replace(active, to_be_deleted=True)) == "delete"
    attached = dataclasses.replace(active, instance_id="i", to_be_deleted=True)
    assert next_step(attached) is None  # detached first
    assert refuse_delete([active]) is None
    assert refuse_delete([active, attached]) == "Failed to delete volume data. Volume is in use."


def test_devices_placement_and_price() -> None:
    assert free_device([]) == "/dev/sdf" and free_device(["/dev/sdf", "/dev/sdg"]) == "/dev/sdh"
    assert free_device([f"/dev/sd{c}" for c in "fghijklmn"]) is None
    b = dataclasses.replace(V, provisioning={"volume_id": "vol-1", "availability_zone": "us-east-1b"})
    assert placements([[b], [dataclasses.replace(b, name="other")]]) == {("aws", "us-east-1", "us-east-1b")}
    a = dataclasses.replace(b, name="elsewhere", provisioning={"volume_id": "vol-2", "availability_zone": "us-east-1a"})
    with pytest.raises(ValueError, match=r"elsewhere \(us-east-1 us-east-1a\)"):
        placements([[b], [a]])
    with pytest.raises(ValueError, match="data is named at more than one mount point"):
        placements([[b], [a, b]])
    assert price(100) == pytest.approx(8.0) and price(100, 4000) == pytest.approx(13.0)


def test_a_volume_knows_its_cloud_id_once_provisioned() -> None:
    assert V.volume_id is None
    assert dataclasses.replace(V, provisioning={"volume_id": "vol-123"}).volume_id == "vol-123"


def test_volume_names_are_those_of_network_mounts_only() -> None:
    conf = {"volumes": ["data:/data", "/host/cache:/cache", {"name": ["a", "b"], "path": "/m"}]}
    assert volume_names(conf) == ["data", "a", "b"]
    assert volume_names({}) == []


def test_a_deleted_volume_needs_nothing() -> None:
    assert next_step(dataclasses.replace(V, deleted=True, to_be_deleted=True)) is None


def _at(name: str, region: str, zone: str | None) -> VolumeRec:
    prov = {"volume_id": f"vol-{name}", "availability_zone": zone} if zone else None
    return dataclasses.replace(V, name=name, configuration={**V.configuration, "region": region}, provisioning=prov)


def test_alternatives_place_a_job_where_each_mount_point_has_one_and_it_mounts_that_one() -> None:
    far, near = _at("far", "eu-west-1", "eu-west-1a"), _at("near", "us-east-1", "us-east-1b")
    other = _at("o", "us-east-1", None)
    where = placements([[far, near]])
    assert where == {("aws", "eu-west-1", "eu-west-1a"), ("aws", "us-east-1", "us-east-1b")}
    near2 = dataclasses.replace(near, name="near2")
    assert placements([[far, near], [near2]]) == {("aws", "us-east-1", "us-east-1b")}
    assert chosen([[far, near]], ("aws", "us-east-1", "us-east-1b")) == [near]
    assert chosen([[far, near]], ("aws", "EU-WEST-1", "eu-west-1a")) == [far]
    assert chosen([[other]], ("aws", "us-east-1", "us-east-1c")) == [other]  # no zone yet: its region will do
    assert chosen([[near]], ("aws", "us-east-1", None)) == [near]
    with pytest.raises(ValueError, match=r"far \(eu-west-1 eu-west-1a\) or near|no availability zone"):
        placements([[far], [near]])
    with pytest.raises(ValueError, match=r"none of the volumes far \(eu-west-1 eu-west-1a\)"):
        chosen([[far]], ("aws", "us-east-1", "us-east-1b"))
    with pytest.raises(ValueError, match="near"):
        chosen([[near]], ("local", "us-east-1", "us-east-1b"))
    with pytest.raises(ValueError, match="near"):
        chosen([[near]], ("aws", "us-east-1", "us-east-1a"))
