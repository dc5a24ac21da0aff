"""An offer as stored in an instance row's JSON, and back."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from corral.domain.resources import Gpu, InstanceResources
from corral.scheduler.codec import offer_from_json, offer_to_json, resources_from_json, resources_to_json
from corral.scheduler.types import Offer

RES = InstanceResources(
    cpus=8, memory_mib=32768, gpus=(Gpu("A100", 40960),), spot=True, disk_size_mib=1, cpu_arch="arm"
)


def test_an_offer_survives_a_trip_through_json_text() -> None:
    offer = Offer("aws", "p4d", "us-east-1", 32.77, RES, host_blocks=2, host_total_blocks=4, zone="us-east-1a")
    data = json.loads(json.dumps(offer_to_json(offer)))
    assert data["zone"] == "us-east-1a" and data["resources"]["gpus"] == [
        {"name": "A100", "memory_mib": 40960, "vendor": "nvidia"}
    ]
    assert offer_from_json(data) == offer


def test_an_offer_without_a_zone_stores_none_and_old_rows_read_with_defaults() -> None:
    offer = Offer("local", "local", "local", 0.0, InstanceResources(cpus=2, memory_mib=1024))
    assert "zone" not in offer_to_json(offer)
    old = {"backend": "local", "instance_type": "local", "region": "local", "price": "0",
           "resources": {"cpus": 2, "memory_mib": 1024}, "host_blocks": None}  # fmt: skip
    assert offer_from_json(old) == offer
    assert "gpu_jobs_only" not in offer_to_json(offer)


def test_an_offer_for_gpu_jobs_only_says_so() -> None:
    offer = Offer("slurm", "g1", "hpc", 0.0, RES, zone="gpu", gpu_jobs_only=True)
    data = json.loads(json.dumps(offer_to_json(offer)))
    assert data["gpu_jobs_only"] is True and offer_from_json(data) == offer


def test_resources_ignore_keys_a_newer_server_wrote() -> None:
    data = {**resources_to_json(RES), "nvlink": True}
    assert resources_from_json(data) == RES


@given(
    st.builds(
        InstanceResources,
        cpus=st.integers(0, 512),
        memory_mib=st.integers(0, 2**40),
        gpus=st.lists(st.builds(Gpu, st.text(max_size=8), st.integers(0, 2**20)), max_size=8).map(tuple),
        spot=st.booleans(),
        disk_size_mib=st.integers(0, 2**40),
        cpu_arch=st.none() | st.sampled_from(["x86", "arm"]),
    )
)
def test_any_resources_round_trip(res: InstanceResources) -> None:
    assert resources_from_json(json.loads(json.dumps(resources_to_json(res)))) == res
