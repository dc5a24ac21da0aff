"""The offers a run's plan shows for the fleets it may run in: pure, from a scheduling snapshot.

``runs/get_plan`` lists the offers of the run's own project's backends; a fleet another project exports to
the run's project brings its own (as dstack shows an imported fleet's instances): its instances that could
hold the job (``idle``/``busy``) and, unless the run may only reuse instances, the new instances its
backends offer -- the owner project's backends, as the scheduler provisions them. The rule for "could hold
the job" is the scheduler's (``blocks_needed`` on the fleet's blocks), so what the plan shows is what apply
can use.

Imports the scheduler's types and block arithmetic only.
"""

from __future__ import annotations

from collections.abc import Iterable

from corral.domain.statuses import READY_INSTANCE
from corral.scheduler.blocks import blocks_needed, smallest_carves, total_blocks_for
from corral.scheduler.types import FleetSlot, Offer, QueuedJob

_SHOWN_STATUSES = READY_INSTANCE


def fleet_offers(job: QueuedJob, fleets: Iterable[FleetSlot], reuse_only: bool) -> list[tuple[Offer, str]]:
    """``(offer, availability)`` of ``fleets`` for ``job``: instances first (``idle`` or ``busy``), then
    new instances (``available``), each once."""
    out: list[tuple[Offer, str]] = []
    new: list[Offer] = []
    for fleet in fleets:
        for inst in fleet.instances:
            if inst.status not in _SHOWN_STATUSES or inst.offer is None or inst.resources is None:
                continue
            if blocks_needed(job.requirements, inst.resources, inst.total_blocks) is None:
                continue
            out.append((inst.offer, inst.status))
        if reuse_only or (fleet.nodes_max is not None and len(fleet.instances) >= fleet.nodes_max):
            continue
        for offer in fleet.offers:
            if offer in new:
                continue
            total = total_blocks_for(fleet.blocks, offer.resources)
            if blocks_needed(job.requirements, offer.resources, total) is None:
                continue
            new.append(offer)
    # a host carved into blocks shows once, as its smallest share that fits (as the project's own offers)
    return out + [(offer, "available") for offer in smallest_carves(new)]
