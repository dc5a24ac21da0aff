"""Capacity reservations (``reservation: cr-...`` of a fleet or run), as dstack uses them: the reservation
says the instance type and zone (DescribeCapacityReservations), offers are narrowed to that type in its
region, and the launch targets it (``CapacityReservationSpecification.CapacityReservationTarget``) in its
zone. :func:`lookup` calls EC2 (a boto3 client, run in a thread by the caller) and :func:`find` looks a
reservation up in the regions it is given (``AWSCompute.find_reservation``: every region a project's backend
offers); the rest is pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral.backends.aws import ec2
from corral.scheduler.types import Offer

if TYPE_CHECKING:  # (the plan narrows offers with this module: it loads no SSH code)
    from corral.backends.aws.session import AWSProject, AWSSession


#: A Capacity Block's ``ReservationType`` and the market a launch into it names (EC2 API reference,
#: CapacityReservation ``reservationType`` and InstanceMarketOptionsRequest ``MarketType``).
CAPACITY_BLOCK = "capacity-block"
#: States of a reservation that will be active later (EC2 API reference, CapacityReservation ``state``: a
#: Capacity Block is ``scheduled`` until its start, ``payment-pending`` while paid for; ``pending`` while made).
PENDING_STATES = ("scheduled", "payment-pending", "pending")


@dataclass(frozen=True)
class Reserved:
    """What a capacity reservation holds: where, what, how many are free now."""

    reservation_id: str
    instance_type: str
    zone: str
    region: str
    state: str
    available: int
    tenancy: str = "default"
    #: ``default``, or ``capacity-block`` for an EC2 Capacity Block (EC2 API reference, CapacityReservation
    #: ``reservationType``), which a launch must name as its market.
    reservation_type: str = "default"


def lookup(client: Any, region: str, reservation_id: str) -> Reserved | None:
    """The reservation ``reservation_id`` as EC2 in ``region`` describes it; None when it is not there."""
    try:
        found = ec2.call(client, "describe_capacity_reservations", CapacityReservationIds=[reservation_id])
    except ec2.AWSError as e:
        if e.code in ("InvalidCapacityReservationId.NotFound", "InvalidCapacityReservationId.Malformed"):
            return None
        raise
    for r in found.get("CapacityReservations") or []:
        if r.get("CapacityReservationId") == reservation_id:
            return Reserved(
                reservation_id=reservation_id,
                instance_type=str(r.get("InstanceType") or ""),
                zone=str(r.get("AvailabilityZone") or ""),
                region=region,
                state=str(r.get("State") or ""),
                available=int(r.get("AvailableInstanceCount") or 0),
                tenancy=str(r.get("Tenancy") or "default"),
                reservation_type=str(r.get("ReservationType") or "default"),
            )
    return None


def narrowed(offers: Iterable[Offer], reserved: Iterable[Reserved]) -> list[Offer]:
    """The AWS ``offers`` a reservation can launch (its type, in its region); other backends' pass as they are."""
    places = {(r.region, r.instance_type) for r in reserved}
    return [o for o in offers if o.backend != "aws" or (o.region, o.instance_type) in places]


def problem(r: Reserved | None, reservation_id: str, instance_type: str, count: int) -> str | None:
    """Why ``count`` instances of ``instance_type`` cannot launch into the reservation (None: they can)."""
    if r is None:
        return f"capacity reservation {reservation_id} was not found (reservation)"
    if r.state != "active":
        later = " yet: waiting for it" if r.state in PENDING_STATES else ""
        return f"capacity reservation {reservation_id} is {r.state}, not active{later}"
    if r.instance_type != instance_type:
        return f"capacity reservation {reservation_id} holds {r.instance_type}, not {instance_type}"
    if r.available < count:
        return f"capacity reservation {reservation_id} has {r.available} instance(s) free, {count} needed"
    return None


def waits(r: Reserved | None, count: int) -> bool:
    """Whether a launch that ``r`` cannot take now may wait for it: it is active but short of free
    instances, or it is not active yet (a Capacity Block before its start)."""
    return r is not None and (r.state in PENDING_STATES or (r.state == "active" and r.available < count))


def launch_params(r: Reserved) -> dict[str, Any]:
    """RunInstances' parameters that launch into ``r``: its target, and for a Capacity Block its market
    (``InstanceMarketOptions.MarketType: capacity-block``, as dstack sets it; EC2 User Guide, "Launch instances
    using Capacity Blocks")."""
    params: dict[str, Any] = {
        "CapacityReservationSpecification": {"CapacityReservationTarget": {"CapacityReservationId": r.reservation_id}}
    }
    if r.reservation_type == CAPACITY_BLOCK:
        params["InstanceMarketOptions"] = {"MarketType": CAPACITY_BLOCK}
    if r.tenancy and r.tenancy != "default":
        params["Placement"] = {"Tenancy": r.tenancy}
    return params


async def find(
    session: AWSSession, project: AWSProject, regions: Sequence[str], reservation_id: str
) -> tuple[Reserved, ...]:
    """Where ``reservation_id`` is among ``regions`` (reservation ids are regional). Raises on EC2 errors."""
    found = []
    for region in regions:
        client = await session.ec2(ec2.client, project.creds, region)
        r = await session.ec2(lookup, client, region, reservation_id)
        if r is not None:
            found.append(r)
    return tuple(found)
