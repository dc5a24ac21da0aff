"""How one job sees a fleet: without the instances and offers of backends it is barred from (the local
backend for a host process of a non-admin while the agents have no sandbox), of backends its run's
``backends`` option does not list, and of offers above its run's ``max_price`` -- each recorded on the
view, so that a fleet left empty says why. Pure; imports the scheduler's types only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from corral.scheduler.types import FleetSlot, QueuedJob

#: How corral's backends are named on the wire and in ``backends`` (local and SSH hosts: dstack's ``remote``).
WIRE_NAMES = {"local": "remote", "ssh": "remote"}


def run_backends(backends: Iterable[str]) -> frozenset[str]:
    """corral's backend names that a run's ``backends`` option (dstack's names) allows."""
    wanted = set(backends)
    return frozenset({b for b in wanted if b != "remote"} | ({"local", "ssh"} if "remote" in wanted else set()))


def as_job_sees_it(job: QueuedJob, fleet: FleetSlot) -> FleetSlot:
    """``fleet`` narrowed by ``job``'s barred backends, its ``backends`` and its ``max_price``."""
    if job.barred_backends:
        fleet = _without_backends(fleet, job.barred_backends)
    if job.backends is not None:
        fleet = _only_backends(fleet, job.backends)
    if job.max_price is not None:
        fleet = _within_price(fleet, job.max_price)
    return fleet


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
