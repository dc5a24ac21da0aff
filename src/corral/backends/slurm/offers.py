"""The offers of a Slurm cluster (pure): one per schedulable node and partition, as Slurm reports the node.

Region = the cluster's name, zone = the partition, instance type = the node's name, price 0. A node in a CPU
partition is offered whole, without GPUs (an instance on it is an allocation of the whole node, which corral splits
into blocks, one per CPU, among its jobs). A node in a GPU partition (``gpu_partitions``) is offered only when it
has GRES GPUs, as the model that partition is mapped to (the GRES type on the node is not looked at, as in dstack),
in shares of 1 to all of its GPUs, each with that share of the node's CPUs and memory: a one-GPU run asks Slurm for
one GPU and its share of the node, not for the whole node (dstack slices each offer to the run's lower bounds
instead; corral's offers do not depend on the run). Nodes Slurm gives no new work (drained, draining, down, failing,
reserved, not responding: ``SlurmNode.schedulable``) and partitions that are down are never offered. A node's disk
is not known (0: not matched against the disk requirement).
"""

from __future__ import annotations

from corral.backends.slurm.model import SlurmClusterConfig
from corral.backends.slurm.parse import ClusterSnapshot, SlurmNode
from corral.domain.gpu_models import GpuModel
from corral.domain.resources import Gpu, InstanceResources
from corral.scheduler.types import Offer

BACKEND = "slurm"


def _resources(node: SlurmNode, model: GpuModel | None, share: int) -> InstanceResources:
    """The node, or ``share`` of its GPUs with that share of its CPUs and memory."""
    if model is None:
        return InstanceResources(cpus=node.cpus, memory_mib=node.memory_mib)
    n = node.gpus
    return InstanceResources(
        cpus=max(1, node.cpus * share // n),
        memory_mib=node.memory_mib * share // n,
        gpus=(Gpu(model.name, model.memory_mib, model.vendor),) * share,
    )


def node_offers(config: SlurmClusterConfig, snap: ClusterSnapshot) -> list[Offer]:
    """The cluster's offers: CPU partitions' nodes first, then GPU partitions' (fewest GPUs first), each in the
    order Slurm lists its nodes."""
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
                cpu.append(_offer(config, node, partition, None, 0))
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
