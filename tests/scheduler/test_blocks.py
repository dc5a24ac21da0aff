"""Blocks: equal shares of an instance, the fewest that fit a job, a host carved into instances, and the
host GPUs a carved instance owns."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from corral.domain.resources import Gpu, GpuSpec, InstanceResources, Range, Requirements
from corral.scheduler.blocks import (
    blocks_needed,
    carved_offers,
    pick_host_gpus,
    share,
    smallest_carves,
    total_blocks_for,
)
from corral.scheduler.types import Offer

H100 = Gpu("H100", 80 * 1024)
HOST = InstanceResources(cpus=16, memory_mib=65536, gpus=(H100,) * 4, disk_size_mib=100_000)
CPU_HOST = InstanceResources(cpus=6, memory_mib=12288, disk_size_mib=100_000)


def needs(cpus: int, gpus: int = 0) -> Requirements:
    return Requirements(
        cpu_count=Range(cpus, None), memory=Range(1.0, None), disk=None, gpu=GpuSpec(count=Range(gpus, None))
    )


def test_auto_blocks_are_one_per_gpu_or_else_one_per_cpu_and_a_set_number_is_at_least_one() -> None:
    assert total_blocks_for(None, HOST) == 4
    assert total_blocks_for(None, CPU_HOST) == 6
    assert total_blocks_for(None, InstanceResources(cpus=0, memory_mib=1)) == 1
    assert total_blocks_for(3, HOST) == 3
    assert total_blocks_for(0, HOST) == 1


def test_a_share_has_its_part_of_cpus_memory_and_gpus_and_the_whole_disk() -> None:
    half = share(HOST, 2, 4)
    assert (half.cpus, half.memory_mib, len(half.gpus), half.disk_size_mib) == (8, 32768, 2, 100_000)
    assert share(HOST, 4, 4) is HOST
    assert share(HOST, 5, 4) is HOST


@given(st.integers(1, 8), st.data())
def test_shares_grow_with_the_blocks_and_never_exceed_the_instance(total: int, data: st.DataObject) -> None:
    k = data.draw(st.integers(1, total))
    small, big = share(HOST, k, total), share(HOST, min(total, k + 1), total)
    assert small.cpus <= big.cpus <= HOST.cpus
    assert small.memory_mib <= big.memory_mib <= HOST.memory_mib
    assert len(small.gpus) <= len(big.gpus) <= len(HOST.gpus)


def test_the_fewest_blocks_that_fit_the_job() -> None:
    assert blocks_needed(needs(2, 1), HOST, 4) == 1
    assert blocks_needed(needs(5), HOST, 4) == 2
    assert blocks_needed(needs(2, 3), HOST, 4) == 3
    assert blocks_needed(needs(2, 5), HOST, 4) is None  # not even the whole instance


def test_an_undivided_instance_fits_whole_or_not_at_all() -> None:
    assert blocks_needed(needs(16), HOST, 1) == 1
    assert blocks_needed(needs(17), HOST, 1) is None


def test_a_host_is_carved_into_one_offer_per_size_smallest_first() -> None:
    offers = carved_offers("local", HOST, 4)
    assert [o.instance_type for o in offers] == ["local-1of4", "local-2of4", "local-3of4", "local"]
    assert [len(o.resources.gpus) for o in offers] == [1, 2, 3, 4]
    assert {(o.price, o.region, o.host_total_blocks) for o in offers} == {(0.0, "local", 4)}
    assert [o.host_blocks for o in offers] == [1, 2, 3, 4]
    whole = carved_offers("local", HOST, 0)
    assert [(o.instance_type, o.host_blocks, o.host_total_blocks) for o in whole] == [("local", 1, 1)]


def test_a_plan_shows_a_carved_host_once_as_its_smallest_share() -> None:
    cloud = Offer("aws", "p5", "us-east-1", 98.0, HOST)
    other = Offer("aws", "p4", "us-east-1", 30.0, HOST)
    carved = carved_offers("local", HOST, 4)
    assert smallest_carves([cloud, *carved[1:], other, carved[0]]) == [cloud, carved[1], other]


def test_a_carved_instance_owns_the_lowest_free_gpus_of_its_share_of_the_host() -> None:
    one, two, _, whole = carved_offers("local", HOST, 4)
    assert pick_host_gpus(one, set()) == (0,)
    assert pick_host_gpus(two, {0}) == (1, 2)
    assert pick_host_gpus(two, {0, 1, 2}) is None
    assert pick_host_gpus(whole, set()) == (0, 1, 2, 3)
    assert pick_host_gpus(whole, {3}) is None


def test_a_share_without_gpus_owns_none() -> None:
    cpu_only = carved_offers("local", CPU_HOST, 3)[0]
    assert pick_host_gpus(cpu_only, {0, 1}) == ()
