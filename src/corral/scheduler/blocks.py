"""Blocks: an instance split into equal shares of its CPUs, memory and GPUs (the disk is shared), and a
host split the same way into the instances carved out of it (the ``local`` backend's machine)."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import replace

from corral.domain.resources import InstanceResources, Requirements, match_requirements
from corral.scheduler.types import Offer

#: The key of a carved instance's stored offer that lists the host's GPUs (indexes) it owns.
HOST_GPUS_KEY = "host_gpus"


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


@functools.lru_cache(maxsize=4096)
def blocks_needed(req: Requirements, resources: InstanceResources, total_blocks: int) -> int | None:
    """The fewest blocks of the instance that satisfy ``req`` (None if even all of them don't). Memoised: a
    queue asks it for the same few shapes of job and instance over and over."""
    if total_blocks <= 1:
        return 1 if match_requirements(req, resources) is None else None
    for k in range(1, total_blocks + 1):
        if match_requirements(req, share(resources, k, total_blocks)) is None:
            return k
    return None


def takes_job(req: Requirements, offer: Offer) -> bool:
    """Whether a new instance of ``offer`` may hold a job of ``req``: an offer for GPU jobs only (a Slurm GPU
    partition's node) takes the jobs that ask for at least one GPU."""
    return not offer.gpu_jobs_only or (req.gpu is not None and (req.gpu.count.min or 0) >= 1)


#: Why an offer for GPU jobs only does not take a job that asks for none.
GPU_JOBS_ONLY = "its offer takes only jobs that ask for GPUs (a GPU partition); set `gpu:` to use it"


def carved_offers(backend: str, host: InstanceResources, host_blocks: int) -> tuple[Offer, ...]:
    """The instances a host split into ``host_blocks`` equal blocks can be carved into: one offer per size,
    1 block up to the whole host, smallest first (the scheduler takes the first that fits the job), each
    with that share of the CPUs, memory and GPUs and the whole disk (shared), price 0."""
    n = max(1, host_blocks)
    return tuple(
        Offer(
            backend=backend,
            instance_type=backend if k == n else f"{backend}-{k}of{n}",
            region=backend,
            price=0.0,
            resources=share(host, k, n),
            host_blocks=k,
            host_total_blocks=n,
        )
        for k in range(1, n + 1)
    )


def smallest_carves(offers: Iterable[Offer]) -> list[Offer]:
    """``offers`` with each carved host shown once: its smallest share among them (what a plan shows:
    the instance a job or fleet would get), other offers as they are."""
    seen: set[str] = set()
    out: list[Offer] = []
    for offer in offers:
        if offer.host_blocks:
            if offer.backend in seen:
                continue
            seen.add(offer.backend)
        out.append(offer)
    return out


def pick_host_gpus(offer: Offer, held: set[int]) -> tuple[int, ...] | None:
    """The host's GPUs (indexes) an instance carved by ``offer`` owns: the lowest ones no other live
    instance of the host holds (``held``); () for a share without GPUs, None if not enough are free.
    The host's blocks are equal shares, so a share's GPUs come from the first ``per block x total
    blocks`` of the host's; the whole host has them all."""
    want = len(offer.resources.gpus)
    if want == 0:
        return ()
    whole = offer.host_blocks >= offer.host_total_blocks
    usable = want if whole else want // max(1, offer.host_blocks) * offer.host_total_blocks
    free = [i for i in range(usable) if i not in held]
    return tuple(free[:want]) if len(free) >= want else None
