"""Instances added or freed outside placement: reservations that bring a fleet up to ``nodes.min``, and idle
instances carved out of a shared host (the local machine) terminated so that the host can hold a waiting
gang's new instances. Pure; imports the scheduler's types, blocks and ledger only.
"""

from __future__ import annotations

from corral.scheduler.blocks import blocks_needed, total_blocks_for
from corral.scheduler.fallbacks import fallbacks
from corral.scheduler.ledger import Ledger
from corral.scheduler.types import Decision, FleetSlot, Offer, QueuedJob, Reclaim, Reserve, Snapshot


def reclaim_for(jobs: list[QueuedJob], fleets: list[FleetSlot], snapshot: Snapshot, ledger: Ledger) -> list[Decision]:
    """Idle instances to terminate so that the host they were carved out of can hold the gang's new
    instances (the local machine), when that is what stops it -- and when they are enough. Their blocks
    are taken from the ledger: nothing later in this pass is placed on them."""
    if not snapshot.host_pools or jobs[0].creation_policy == "reuse" or jobs[0].selectors is not None:
        return []
    for fleet in fleets:
        if fleet.nodes_max is not None and ledger.fleet_count.get(fleet.id, 0) + len(jobs) > fleet.nodes_max:
            continue
        for offer in sorted(fleet.offers, key=lambda o: (o.price, o.host_blocks)):
            pool = snapshot.host_pools.get(offer.backend) if offer.host_blocks else None
            if pool is None:
                continue
            total = total_blocks_for(fleet.blocks, offer.resources)
            if any(blocks_needed(j.requirements, offer.resources, total) is None for j in jobs):
                continue
            need = offer.host_blocks * len(jobs) - (pool[1] - ledger.host_used.get(offer.backend, 0))
            idle = sorted(
                (
                    i
                    for f in snapshot.fleets
                    if len(f.instances) > f.nodes_min
                    for i in f.instances
                    if i.backend == offer.backend
                    and i.host_blocks
                    and i.status == "idle"
                    and i.busy_blocks == 0
                    and ledger.free_blocks.get(i.id, 0) >= i.total_blocks
                ),
                key=lambda i: -i.host_blocks,
            )
            if need <= 0 or sum(i.host_blocks for i in idle) < need:
                continue
            out: list[Decision] = []
            freed: list[str] = []
            for inst in idle:
                if need <= 0:
                    break
                ledger.free_blocks[inst.id] = 0
                freed.append(inst.id)
                need -= inst.host_blocks
                out.append(Reclaim(inst.id, f"Terminated to free this machine for run {jobs[0].run_name}"))
            ledger.changed(freed)
            return out
    return []


def upkeep(fleet: FleetSlot, host_free: dict[str, int] | None = None) -> list[Reserve]:
    """Reservations that bring ``fleet`` up to ``nodes.min`` (through the same commit point). An offer
    carved out of a host is reserved only while ``host_free`` (backend -> free blocks; mutated) has room."""
    missing = fleet.nodes_min - len(fleet.instances)
    if missing <= 0 or not fleet.offers:
        return []
    offer: Offer = min(fleet.offers, key=lambda o: o.price)
    total = total_blocks_for(fleet.blocks, offer.resources)
    out: list[Reserve] = []
    others = fallbacks(offer, fleet.offers, fleet.blocks, 0, total, None)
    for _ in range(missing):
        if offer.host_blocks and host_free is not None and offer.backend in host_free:
            if host_free[offer.backend] < offer.host_blocks:
                break
            host_free[offer.backend] -= offer.host_blocks
        out.append(Reserve(fleet.id, offer, 0, total, fallbacks=others))
    return out
