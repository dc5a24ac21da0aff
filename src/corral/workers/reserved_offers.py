"""Offers of fleets and runs with a ``reservation`` (an EC2 capacity reservation), narrowed as dstack
narrows them: to the reservation's instance type in its region. The scheduling worker asks EC2 once per reservation
(DescribeCapacityReservations in each region the project's aws backend offers) after it loaded the
fleets, with no transaction open, and keeps the answer while the server runs; placement then reads it.
A reservation EC2 does not know leaves the fleet no aws offer; one EC2 could not be asked about yet
(an error) leaves the offers as they are, and is asked about again on the next pass. A run's own
reservation is looked up the same way and given to its queued jobs (``QueuedJob.reserved_places``), for
``scheduler.fleet_view`` to narrow each fleet's offers as the job sees them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from operator import attrgetter, is_
from typing import Any

from corral.backends.base import Compute
from corral.domain.documents import spec_configuration
from corral.domain.records import FleetRec
from corral.scheduler.types import Offer, QueuedJob

log = logging.getLogger("corral.reservations")

_RESERVATION = attrgetter("reservation")
_is_none = partial(is_, None)


class ReservedOffers:
    def __init__(self, computes: Mapping[str, Compute]) -> None:
        self.computes = computes
        #: (project, reservation id) -> where it is (empty: EC2 knows it nowhere).
        self.places: dict[tuple[str, str], tuple[Any, ...]] = {}

    @staticmethod
    def reservation(fleet: FleetRec) -> str | None:
        conf = spec_configuration(fleet.spec)
        if conf.get("ssh_config") or not conf.get("reservation"):
            return None
        return str(conf["reservation"])

    def known(self, fleet: FleetRec) -> tuple[Any, ...] | None:
        """Where the fleet's reservation is, if it has one and EC2 was asked (None otherwise)."""
        rid = self.reservation(fleet)
        return None if rid is None else self.places.get((fleet.project_name, rid))

    async def resolve(self, fleets: Iterable[FleetRec]) -> None:
        """Ask EC2 about the reservations of ``fleets`` not asked about yet."""
        await self._ask({(f.project_name, r) for f in fleets if (r := self.reservation(f)) is not None})

    async def located(self, jobs: Sequence[QueuedJob]) -> list[QueuedJob]:
        """``jobs``, those of runs with their own ``reservation`` told where it is (once EC2 was asked)."""
        if all(map(_is_none, map(_RESERVATION, jobs))):  # the usual queue: in C, not a step per job
            return list(jobs)
        await self._ask({(j.project_name, j.reservation) for j in jobs if j.reservation is not None})
        out = []
        for j in jobs:
            found = None if j.reservation is None else self.places.get((j.project_name, j.reservation))
            if found is not None:
                j = replace(j, reserved_places=frozenset((r.region, r.instance_type) for r in found))
            out.append(j)
        return out

    async def _ask(self, todo: set[tuple[str, str]]) -> None:
        compute = self.computes.get("aws")
        if compute is None or not todo - self.places.keys():
            return
        from corral.backends.aws.compute import AWSCompute

        if not isinstance(compute, AWSCompute):
            return
        for project_name, rid in sorted(todo - self.places.keys()):
            try:
                self.places[(project_name, rid)] = await compute.find_reservation(project_name, rid)
            except Exception as e:  # asked again on the next pass
                log.warning("could not look capacity reservation %s of %s up: %s", rid, project_name, e)

    def narrowed(self, fleet: FleetRec, offers: Sequence[Offer]) -> list[Offer]:
        """``offers`` of the fleet, the aws ones narrowed to its reservation (once EC2 was asked about it)."""
        places = self.known(fleet)
        if places is None:
            return list(offers)
        from corral.backends.aws import reservations

        return reservations.narrowed(offers, places)
