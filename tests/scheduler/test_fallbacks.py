"""The offers a reservation falls back on when its cloud cannot launch the chosen one."""

from __future__ import annotations

from corral.domain.resources import GpuSpec, InstanceResources, Range, Requirements
from corral.scheduler.blocks import carved_offers
from corral.scheduler.fallbacks import MAX_FALLBACKS, fallbacks
from corral.scheduler.types import Offer

R8 = InstanceResources(cpus=8, memory_mib=32768, disk_size_mib=500_000)
R16 = InstanceResources(cpus=16, memory_mib=65536, disk_size_mib=500_000)
CHOSEN = Offer("aws", "m7i.2xlarge", "us-east-1", 0.4, R8)


def aws(region: str, price: float, res: InstanceResources = R8, kind: str = "m7i.2xlarge") -> Offer:
    return Offer("aws", kind, region, price, res)


def test_fallbacks_are_other_offers_of_the_same_backend_cheapest_first_and_at_most_three() -> None:
    offers = [aws("eu-west-1", 0.5), CHOSEN, aws("us-west-2", 0.45), Offer("gcp", "n2", "x", 0.1, R8),
              aws("ap-south-1", 0.6), aws("sa-east-1", 0.7), aws("us-west-2", 0.45)]  # fmt: skip
    out = fallbacks(CHOSEN, offers, blocks=1, need=1, total=1, req=None)
    assert [o.region for o in out] == ["us-west-2", "eu-west-1", "ap-south-1"]
    assert len(out) == MAX_FALLBACKS


def test_fallbacks_keep_the_blocks_the_scheduler_decided() -> None:
    # with blocks auto (one per CPU), a 16-CPU instance has 16 blocks, not the chosen 8
    auto = fallbacks(CHOSEN, [aws("eu-west-1", 0.5, R16, "m7i.4xlarge"), aws("us-west-2", 0.5)], None, 2, 8, None)
    assert [o.region for o in auto] == ["us-west-2"]
    # with blocks 2, a job of 5 CPUs needs 2 blocks of an 8-CPU instance but 1 of a 16-CPU one
    req = Requirements(cpu_count=Range(5, None), memory=Range(1.0, None), disk=None, gpu=GpuSpec(count=Range(0, None)))
    same = fallbacks(CHOSEN, [aws("eu-west-1", 0.5, R16, "m7i.4xlarge"), aws("us-west-2", 0.5)], 2, 2, 2, req)
    assert [o.region for o in same] == ["us-west-2"]


def test_a_carved_host_has_no_fallbacks_and_is_none() -> None:
    carved = carved_offers("local", R8, 2)
    assert fallbacks(carved[0], carved, 2, 1, 2, None) == ()
    plain_local = Offer("local", "local", "local", 0.0, R8)
    assert fallbacks(plain_local, [plain_local, *carved], 1, 1, 1, None) == ()
