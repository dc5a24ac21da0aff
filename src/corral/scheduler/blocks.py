"""Blocks: an instance split into equal shares of its CPUs, memory and GPUs (the disk is shared)."""

from __future__ import annotations

from dataclasses import replace

from corral.domain.resources import InstanceResources, Requirements, match_requirements


def total_blocks_for(blocks: int | None, resources: InstanceResources) -> int:
    """The number of blocks of an instance for a fleet's ``blocks`` setting (None = ``auto``)."""
    if blocks is not None:
        return max(1, blocks)
    if resources.gpus:
        return len(resources.gpus)
    return max(1, resources.cpus)


def share(resources: InstanceResources, blocks: int, total_blocks: int) -> InstanceResources:
    """The resources of ``blocks`` of ``total_blocks`` equal shares of an instance."""
    if blocks >= total_blocks:
        return resources
    gpus_per_block = len(resources.gpus) // total_blocks
    return replace(
        resources,
        cpus=resources.cpus * blocks // total_blocks,
        memory_mib=resources.memory_mib * blocks // total_blocks,
        gpus=tuple(resources.gpus[: gpus_per_block * blocks]),
    )


def blocks_needed(req: Requirements, resources: InstanceResources, total_blocks: int) -> int | None:
    """The fewest blocks of the instance that satisfy ``req`` (None if even all of them don't)."""
    if total_blocks <= 1:
        return 1 if match_requirements(req, resources) is None else None
    for k in range(1, total_blocks + 1):
        if match_requirements(req, share(resources, k, total_blocks)) is None:
            return k
    return None
