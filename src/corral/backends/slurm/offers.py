"""The offers of a Slurm cluster (pure): per schedulable node and partition, shares of the node as Slurm reports it.

Region = the cluster's name, zone = the partition, instance type = the node's name, price 0. An instance is an
allocation of a share of a node, so that a small run asks Slurm for what it needs, not for a whole node (dstack
slices each offer to the run's lower bounds; corral's offers do not depend on the run, so it lists the shares and
the scheduler takes the smallest that holds the job). A node in a CPU partition is offered without GPUs, in shares
of 1, 2, 4... of its CPUs and all of them, each with that share of its memory. A node in a GPU partition
(``gpu_partitions``) is offered only when it has GRES GPUs, as the model that partition is mapped to (the GRES
type on the node is not looked at, as in dstack), in shares of 1 to all of its GPUs, each with that share of the
node's CPUs and memory, and only to jobs that ask for GPUs (``Offer.gpu_jobs_only``). Nodes Slurm gives no new
work (drained, draining, down, failing, reserved, not responding: ``SlurmNode.schedulable``) and partitions that
are down are never offered. A node's disk is not known (0: not matched against the disk requirement).
"""

from __future__ import annotations

from corral.backends.slurm.model import SlurmClusterConfig
from corral.backends.slurm.parse import ClusterSnapshot, SlurmNode
from corral.domain.gpu_models import GpuModel
from corral.domain.resources import Gpu, InstanceResources
from corral.scheduler.types import Offer

BACKEND = "slurm"


def cpu_shares(cpus: int) -> list[int]:
    """The CPU counts a CPU node is offered in: the powers of two below its CPUs, and all of them."""
    out, k = [], 1
    while k < cpus:
        out.append(k)
        k *= 2
    return [*out, cpus]


def _resources(node: SlurmNode, model: GpuModel | None, share: int) -> InstanceResources:
    """``share`` of the node's GPUs (of its CPUs on a CPU node) with that share of its CPUs and memory."""
    if model is None:
        return InstanceResources(cpus=share, memory_mib=node.memory_mib * share // max(1, node.cpus))
    n = node.gpus
    return InstanceResources(
        cpus=max(1, node.cpus * share // n),
        memory_mib=node.memory_mib * share // n,
        gpus=(Gpu(model.name, model.memory_mib, model.vendor),) * share,
    )


def node_offers(config: SlurmClusterConfig, snap: ClusterSnapshot) -> list[Offer]:
    """The cluster's offers: CPU partitions' nodes first, then GPU partitions', each in the order Slurm lists its
    nodes, each node's shares smallest first (the scheduler takes the first that holds the job)."""
    known = tuple(p.name for p in snap.partitions)
    up = {p.name for p in snap.partitions if p.up}
    cpu: list[Offer] = []
    gpu: list[Offer] = []
    for node in snap.nodes:
        if not node.schedulable:
            continue
        for partition in node.partitions:
            if partition not in up:
                continue
            model = config.gpu_model(partition)
            if model is not None:
                gpu.extend(_offer(config, node, partition, model, k) for k in range(1, node.gpus + 1))
            elif config.is_cpu_partition(partition, known):
                cpu.extend(_offer(config, node, partition, None, k) for k in cpu_shares(node.cpus))
    return cpu + gpu


def _offer(config: SlurmClusterConfig, node: SlurmNode, partition: str, model: GpuModel | None, share: int) -> Offer:
    return Offer(
        backend=BACKEND,
        instance_type=node.name,
        region=config.name,
        price=0.0,
        resources=_resources(node, model, share),
        zone=partition,
        gpu_jobs_only=model is not None,
    )
