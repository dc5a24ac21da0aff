"""The offers a reservation may fall back on: when a cloud cannot launch the chosen offer (no capacity in
any zone, a quota reached in its region, parameters it refuses), the backend tries these next, in order.

They are the fleet's next offers, as the job sees them (its filters already applied), of the same backend,
cheapest first, that hold the job with the same blocks -- so that whichever one launches, what the scheduler
decided still holds. Offers carved out of a host (the local backend) have none: the host is the capacity.
At most ``MAX_FALLBACKS`` of them. Pure; imports the scheduler's types and block arithmetic only.
"""

from __future__ import annotations

from collections.abc import Iterable

from corral.domain.resources import Requirements
from corral.scheduler.blocks import blocks_needed, takes_job, total_blocks_for
from corral.scheduler.types import Offer

#: Where an instance row's ``offer`` lists them (each as ``codec.offer_to_json``).
FALLBACKS_KEY = "fallbacks"
#: How many offers a reservation carries besides its own (the launch's attempts are bounded anyway).
MAX_FALLBACKS = 3


def fallbacks(
    chosen: Offer, offers: Iterable[Offer], blocks: int | None, need: int, total: int, req: Requirements | None
) -> tuple[Offer, ...]:
    """``offers`` (any order) that may stand in for ``chosen``: same backend, not carved out of a host, the
    same ``total`` blocks per instance and (with ``req``, a job's) the same ``need`` of them, cheapest first."""
    if chosen.host_blocks:
        return ()
    out: list[Offer] = []
    for offer in sorted(offers, key=lambda o: (o.price, o.region, o.instance_type)):
        if len(out) >= MAX_FALLBACKS:
            break
        if offer == chosen or offer in out or offer.backend != chosen.backend or offer.host_blocks:
            continue
        if total_blocks_for(blocks, offer.resources) != total:
            continue
        if req is not None and (not takes_job(req, offer) or blocks_needed(req, offer.resources, total) != need):
            continue
        out.append(offer)
    return tuple(out)
