"""The offers a run's plan shows for the fleets it may run in: instances that could hold the job, then
the new instances the fleets' backends offer, each once."""

from __future__ import annotations

from corral.domain.resources import Gpu, GpuSpec, InstanceResources, Range, Requirements
from corral.scheduler.blocks import carved_offers
from corral.scheduler.plan_offers import fleet_offers
from corral.scheduler.types import FleetSlot, InstanceSlot, Offer, QueuedJob, WaitPolicy

BIG = InstanceResources(cpus=16, memory_mib=65536, gpus=(Gpu("H100", 81920),) * 2, disk_size_mib=500_000)
SMALL = InstanceResources(cpus=2, memory_mib=4096, disk_size_mib=500_000)
BIG_OFFER = Offer("aws", "p5", "us-east-1", 98.0, BIG)
SMALL_OFFER = Offer("aws", "t3", "us-east-1", 0.1, SMALL)


def job(gpus: int = 1) -> QueuedJob:
    req = Requirements(cpu_count=Range(1, None), memory=Range(1.0, None), gpu=GpuSpec(count=Range(gpus, None)))
    return QueuedJob("j", "r", "p", "run", 0, 0, 0.0, req, None, "reuse-or-create", WaitPolicy(True))


def inst(i: int, status: str, offer: Offer | None = BIG_OFFER, total: int = 1) -> InstanceSlot:
    res = offer.resources if offer else None
    return InstanceSlot(f"i{i}", "f", f"f-{i}", i, status, res, total, 0, offer=offer)


def fleet(instances: tuple[InstanceSlot, ...], offers: tuple[Offer, ...], nodes_max: int | None = None) -> FleetSlot:
    return FleetSlot("f", "p", "f", 0, nodes_max, 1, "any", offers, instances)


def test_ready_instances_that_could_hold_the_job_come_first_then_new_ones() -> None:
    f = fleet(
        (inst(0, "idle"), inst(1, "busy"), inst(2, "provisioning"), inst(3, "idle", SMALL_OFFER)),
        (BIG_OFFER, SMALL_OFFER),
    )
    assert fleet_offers(job(), [f], reuse_only=False) == [
        (BIG_OFFER, "idle"),
        (BIG_OFFER, "busy"),
        (BIG_OFFER, "available"),
    ]


def test_an_instance_without_its_offer_or_resources_is_not_shown() -> None:
    bare = InstanceSlot("i9", "f", "f-9", 9, "idle", None, 1, 0, offer=BIG_OFFER)
    assert fleet_offers(job(), [fleet((inst(0, "idle", None), bare), ())], reuse_only=False) == []


def test_reuse_only_and_a_full_fleet_offer_no_new_instances() -> None:
    f = fleet((inst(0, "busy"),), (BIG_OFFER,), nodes_max=1)
    assert fleet_offers(job(), [f], reuse_only=False) == [(BIG_OFFER, "busy")]
    roomy = fleet((inst(0, "busy"),), (BIG_OFFER,), nodes_max=2)
    assert fleet_offers(job(), [roomy], reuse_only=True) == [(BIG_OFFER, "busy")]
    assert fleet_offers(job(), [roomy], reuse_only=False)[-1] == (BIG_OFFER, "available")


def test_an_offer_two_fleets_share_shows_once() -> None:
    assert fleet_offers(job(), [fleet((), (BIG_OFFER,)), fleet((), (BIG_OFFER,))], reuse_only=False) == [
        (BIG_OFFER, "available")
    ]


def test_a_carved_host_shows_as_its_smallest_share_that_fits() -> None:
    host = InstanceResources(cpus=16, memory_mib=65536, gpus=(Gpu("H100", 81920),) * 4, disk_size_mib=500_000)
    carved = carved_offers("local", host, 4)
    shown = fleet_offers(job(gpus=2), [fleet((), carved)], reuse_only=False)
    assert shown == [(carved[1], "available")]
