"""The agent's side of network volumes: the submission carries them (checked like every field), and the
block device of an EBS volume is looked for where EC2 instances have it, most specific first."""

from __future__ import annotations

import pytest

from corral.agent.protocol import JobSubmission, NetworkMount, ProtocolError
from corral.agent.volumes import candidates


def test_network_volumes_round_trip_and_are_checked() -> None:
    sub = JobSubmission(job_id="j1", run_name="r", commands=["true"])
    sub.network_volumes = [NetworkMount("data", "vol-0abc", "/dev/sdf", "/data")]
    back = JobSubmission.from_dict(sub.to_dict())
    assert back.network_volumes == sub.network_volumes
    for bad in ({"name": "data", "volume_id": "vol-1", "device_name": "/dev/sdf", "path": "data"},
                {"name": "../x", "volume_id": "vol-1", "device_name": "/dev/sdf", "path": "/x"},
                {"name": "data", "volume_id": "", "device_name": "/dev/sdf", "path": "/x"}):  # fmt: skip
        with pytest.raises(ProtocolError, match="network_volumes"):
            JobSubmission.from_dict({**sub.to_dict(), "network_volumes": [bad]})


def test_the_device_is_looked_for_by_id_then_by_name() -> None:
    m = NetworkMount("data", "vol-0abc", "/dev/sdg", "/data")
    assert candidates(m) == ["/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol0abc", "/dev/sdg", "/dev/xvdg"]
