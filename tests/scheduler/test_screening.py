"""Screening: the fleets a run could ever run in, or the message it fails with at once."""

from __future__ import annotations

from dataclasses import replace

from corral.domain.resources import Gpu, GpuSpec, InstanceResources, Range, Requirements
from corral.domain.selectors import Selector
from corral.scheduler.screening import NO_FLEETS_MESSAGE, screen
from corral.scheduler.types import FleetSlot, InstanceSlot, Offer, QueuedJob, Snapshot, WaitPolicy

MACHINE = InstanceResources(cpus=8, memory_mib=32768, disk_size_mib=500_000)
SMALL = Requirements(cpu_count=Range(1, None), memory=Range(1.0, None), disk=None)


def job(req: Requirements = SMALL, **kw: object) -> QueuedJob:
    base = QueuedJob("j", "r", "p", "run", 0, 0, 0.0, req, None, "reuse-or-create", WaitPolicy(True))
    return replace(base, **kw)  # type: ignore[arg-type]


def fleet(instances: tuple[InstanceSlot, ...] = (), offers: tuple[Offer, ...] = (), name: str = "f") -> FleetSlot:
    return FleetSlot(name, "p", name, 0, None, 1, "any", offers, instances, project_name="main")


def test_a_project_without_fleets_fails_with_dstacks_no_fleets_message() -> None:
    assert screen(job(), Snapshot((), ())) == NO_FLEETS_MESSAGE


def test_selectors_without_any_fleet_name_what_matched_nothing() -> None:
    pinned = job(selectors=(Selector(name="gpu-0"), Selector(hostname="10.0.0.9")))
    assert screen(pinned, Snapshot((), ())) == (
        "Failed to use specified instances: no instance matches name: gpu-0; hostname: 10.0.0.9"
    )


def test_a_host_still_being_set_up_may_fit_any_job() -> None:
    setting_up = InstanceSlot("i0", "f", "f-0", 0, "pending", None, 1, 0)
    f = fleet((setting_up,))
    huge = replace(SMALL, gpu=GpuSpec(count=Range(8, None)))
    assert screen(job(huge), Snapshot((f,), ())) == ([f], False)


def test_a_fleet_that_can_never_hold_the_job_is_named_with_the_reason() -> None:
    offer = Offer("aws", "m7i", "us-east-1", 1.0, MACHINE)
    gpu_job = job(replace(SMALL, gpu=GpuSpec(count=Range(1, None))))
    assert screen(gpu_job, Snapshot((fleet(offers=(offer,)),), ())) == (
        "No fleet can ever run this job: fleet 'f': needs gpu count 1.., instance has 0"
    )


def test_reuse_only_without_instances_can_never_run() -> None:
    f = fleet(offers=(Offer("aws", "m7i", "us-east-1", 1.0, MACHINE),))
    assert screen(job(creation_policy="reuse"), Snapshot((f,), ())) == (
        "No fleet can ever run this job: fleet 'f': it has no instances and `creation_policy: reuse` allows no new ones"
    )


def test_a_run_may_use_a_fleet_with_a_gpu_instance_that_fits() -> None:
    gpu_host = replace(MACHINE, gpus=(Gpu("L4", 24 * 1024),))
    inst = InstanceSlot("i0", "f", "f-0", 0, "idle", gpu_host, 1, 0)
    f = fleet((inst,))
    assert screen(job(replace(SMALL, gpu=GpuSpec(count=Range(1, None)))), Snapshot((f,), ())) == ([f], False)
