"""How one job sees a fleet: without the instances and offers of backends it is barred from (the local
backend for a host process of a non-admin while the agents have no sandbox), of backends its run's
``backends`` option does not list, of offers above its run's ``max_price``, and of instances and offers
outside its ``regions`` / ``instance_types`` / ``spot_policy`` -- each recorded on the view, so that a
fleet left empty says why. A run's own ``reservation`` narrows the new instances as dstack's does: a fleet
that names another reservation offers it none, and aws offers are the reservation's type in its region
(on-demand: spot cannot launch into one; no other backend); instances already there stay. The rule is
``offer_filters``' (the listings' too). Pure; imports the scheduler's types and ``offer_filters`` only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from corral.scheduler import offer_filters
from corral.scheduler.offer_filters import OfferFilter
from corral.scheduler.types import FleetSlot, InstanceSlot, Offer, QueuedJob

#: How corral's backends are named on the wire and in ``backends`` (local and SSH hosts: dstack's ``remote``).
WIRE_NAMES = {"local": "remote", "ssh": "remote"}


def run_backends(backends: Iterable[str]) -> frozenset[str]:
    """corral's backend names that a run's ``backends`` option (dstack's names) allows."""
    return offer_filters.corral_backends(backends)


def job_filter(job: QueuedJob) -> OfferFilter:
    """The offer filter of ``job``'s run options (what its plan's listing applies too)."""
    return OfferFilter(job.backends, job.regions, job.instance_types, job.max_price, job.spot, job.zones)


def view_key(job: QueuedJob) -> tuple[object, ...]:
    """Every attribute of ``job`` that :func:`as_job_sees_it` reads: jobs with equal keys see every fleet
    alike (what a scheduling pass memoises on; keep the two together)."""
    return (
        job.barred_backends, job.backends, job.max_price, job.regions, job.instance_types, job.spot, job.zones,
        job.reservation, job.reserved_places,
    )  # fmt: skip


def as_job_sees_it(job: QueuedJob, fleet: FleetSlot) -> FleetSlot:
    """``fleet`` narrowed by ``job``'s barred backends and its run's offer options (all in :func:`view_key`)."""
    if job.barred_backends:
        fleet = _without_backends(fleet, job.barred_backends)
    if job.backends is not None:
        fleet = _only_backends(fleet, job.backends)
    if job.max_price is not None:
        fleet = _within_price(fleet, job.max_price)
    if job.regions is not None or job.instance_types is not None or job.spot is not None or job.zones is not None:
        fleet = _narrowed(fleet, job_filter(job))
    if job.reservation is not None:
        fleet = _reserved(fleet, job.reservation, job.reserved_places)
    return fleet


def reserved_offer(offer: Offer, places: frozenset[tuple[str, str]] | None) -> bool:
    """Whether ``offer`` can launch into a capacity reservation at ``places`` (None: not known yet, any
    aws offer may): an on-demand aws offer there (dstack: only backends with reservations, no spot)."""
    if offer.backend != "aws" or offer.resources.spot:
        return False
    return places is None or (offer.region, offer.instance_type) in places


def _reserved(fleet: FleetSlot, reservation: str, places: frozenset[tuple[str, str]] | None) -> FleetSlot:
    """``fleet``'s new instances for a run whose ``reservation`` is ``reservation`` at ``places``."""
    if fleet.reservation is not None and fleet.reservation != reservation:
        offers: tuple[Offer, ...] = ()  # dstack: the two reservations do not combine
    else:
        offers = tuple(o for o in fleet.offers if reserved_offer(o, places))
    if len(offers) == len(fleet.offers):
        return fleet
    return replace(fleet, offers=offers, narrowed_by=(*fleet.narrowed_by, "reservation"))


def _narrowed(fleet: FleetSlot, f: OfferFilter) -> FleetSlot:
    """``fleet`` without the instances outside ``f``'s regions and instance types, and the offers ``f``
    refuses (spot or on-demand too)."""
    insts = tuple(i for i in fleet.instances if _instance_passes(i, f))
    offers = tuple(offer_filters.pinned(o, f) for o in fleet.offers if offer_filters.passes(o, f))
    if len(insts) == len(fleet.instances) and offers == fleet.offers:
        return fleet
    names = [n for n, v in (("regions", f.regions), ("instance_types", f.instance_types)) if v is not None]
    if f.spot is not None:
        names.append("spot_policy")
    if f.zones is not None:
        names.append("volumes")
    return replace(fleet, instances=insts, offers=offers, narrowed_by=tuple(names))


def _instance_passes(inst: InstanceSlot, f: OfferFilter) -> bool:
    offer = inst.offer
    if offer is None:  # a host being set up: where it is is its fleet's business
        return True
    return offer_filters.instance_passes(offer, f)


def _without_backends(fleet: FleetSlot, barred: frozenset[str]) -> FleetSlot:
    """``fleet`` as a job barred from ``barred`` backends sees it: none of their instances or offers."""
    if not any(i.backend in barred for i in fleet.instances) and not any(o.backend in barred for o in fleet.offers):
        return fleet
    return replace(
        fleet,
        instances=tuple(i for i in fleet.instances if i.backend not in barred),
        offers=tuple(o for o in fleet.offers if o.backend not in barred),
        withheld_backends=barred,
    )


def _only_backends(fleet: FleetSlot, allowed: frozenset[str]) -> FleetSlot:
    """``fleet`` as a job whose ``backends`` option lists ``allowed`` sees it."""
    left_out = {i.backend for i in fleet.instances if i.backend not in allowed}
    left_out |= {o.backend for o in fleet.offers if o.backend not in allowed}
    if not left_out:
        return fleet
    return replace(
        fleet,
        instances=tuple(i for i in fleet.instances if i.backend in allowed),
        offers=tuple(o for o in fleet.offers if o.backend in allowed),
        unlisted_backends=frozenset(left_out),
    )


def _within_price(fleet: FleetSlot, max_price: float) -> FleetSlot:
    """``fleet`` without the offers that cost more than ``max_price`` (its instances stay: they are paid for)."""
    dear = [o.price for o in fleet.offers if o.price > max_price]
    if not dear:
        return fleet
    return replace(fleet, offers=tuple(o for o in fleet.offers if o.price <= max_price), priced_out=min(dear))
