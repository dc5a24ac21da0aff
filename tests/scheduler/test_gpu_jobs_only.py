"""Offers for GPU jobs only (a Slurm GPU partition's node): a job that asks for no GPU never gets a new instance of
one (dstack sends such runs to the CPU partitions), in placement, screening and a reservation's fallbacks."""

from __future__ import annotations

from corral.domain.resources import Gpu, GpuSpec, InstanceResources, Range, Requirements
from corral.scheduler.blocks import GPU_JOBS_ONLY, takes_job
from corral.scheduler.fallbacks import fallbacks
from corral.scheduler.schedule import schedule
from corral.scheduler.types import Fail, FleetSlot, Offer, QueuedJob, Reserve, Snapshot, WaitPolicy

NODE = InstanceResources(cpus=4, memory_mib=16000)
GPU_NODE = InstanceResources(cpus=4, memory_mib=16000, gpus=(Gpu("A100", 81920),) * 2)
CPU_OFFER = Offer("slurm", "n1", "hpc", 0.0, NODE, zone="cpu")
GPU_OFFER = Offer("slurm", "g1", "hpc", 0.0, GPU_NODE, zone="gpu", gpu_jobs_only=True)
CPU_JOB = Requirements(cpu_count=Range(1, None), memory=Range(1.0, None), disk=None, gpu=GpuSpec(count=Range(0, None)))
GPU_JOB = Requirements(cpu_count=Range(1, None), memory=Range(1.0, None), disk=None, gpu=GpuSpec(count=Range(1, None)))


def _job(i: int, req: Requirements) -> QueuedJob:
    return QueuedJob(
        id=f"j{i}", run_id=f"r{i}", project_id="p", run_name=f"run-{i}", job_num=0, priority=0,
        submitted_at=float(i), requirements=req, fleet_names=None, creation_policy="reuse-or-create",
        wait=WaitPolicy(True), nodes=1, multinode=False,
    )  # fmt: skip


def _fleet(*offers: Offer) -> FleetSlot:
    return FleetSlot(
        id="f", project_id="p", name="hpc", nodes_min=0, nodes_max=4, blocks=1, placement="any", offers=offers,
        instances=(),
    )  # fmt: skip


def test_only_jobs_that_ask_for_gpus_are_taken() -> None:
    assert takes_job(GPU_JOB, GPU_OFFER) and takes_job(CPU_JOB, CPU_OFFER) and takes_job(GPU_JOB, CPU_OFFER)
    assert not takes_job(CPU_JOB, GPU_OFFER)
    assert not takes_job(Requirements(gpu=None), GPU_OFFER)


def test_a_cpu_job_gets_a_cpu_node_even_when_the_gpu_node_comes_first() -> None:
    plan = schedule(Snapshot(fleets=(_fleet(GPU_OFFER, CPU_OFFER),), queue=(_job(1, CPU_JOB), _job(2, GPU_JOB))), 0.0)
    reserves = {d.job_id: d.offer.instance_type for g in plan.gangs for d in g.decisions if isinstance(d, Reserve)}
    assert reserves == {"j1": "n1", "j2": "g1"}


def test_a_cpu_job_in_a_fleet_of_gpu_nodes_only_fails_saying_why() -> None:
    plan = schedule(Snapshot(fleets=(_fleet(GPU_OFFER),), queue=(_job(1, CPU_JOB),)), 0.0)
    fails = [d for g in plan.gangs for d in g.decisions if isinstance(d, Fail)]
    assert len(fails) == 1 and GPU_JOBS_ONLY in fails[0].message


def test_a_cpu_jobs_reservation_does_not_fall_back_on_a_gpu_node() -> None:
    other = Offer("slurm", "n2", "hpc", 0.0, NODE, zone="cpu")
    assert fallbacks(CPU_OFFER, [GPU_OFFER, other], 1, 1, 1, CPU_JOB) == (other,)
    assert fallbacks(CPU_OFFER, [GPU_OFFER, other], 1, 1, 1, None) == (GPU_OFFER, other)
