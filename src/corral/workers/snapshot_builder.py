"""The scheduler's view of the stored fleets: each fleet as a ``FleetSlot``, with the backends' offers its
configuration, its project's backends and regions and its capacity reservation allow. Used by the scheduling
worker's passes and by a plan's verdict (``services.plan_verdict``), each with a builder of its own: a
builder keeps each fleet's parsed requirements and matched offers while the fleet's spec stays the same.

What a load reads besides the fleets (who imports them, the projects' backends and regions) is a value of its
own (:class:`FleetFacts`), handed to :meth:`SnapshotBuilder.fleet_slot`: plans made at the same time for
different projects share one builder, and one plan's facts must not become another's while it waits on EC2.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from corral import config  # lazy: the models load on first use, not at start-up
from corral.backends.base import Compute
from corral.domain.access import usable_computes
from corral.domain.documents import spec_configuration
from corral.domain.fleets import fleet_blocks, fleet_placement, nodes_bounds
from corral.domain.records import FleetRec, InstanceRec
from corral.domain.resources import Requirements, match_requirements
from corral.domain.statuses import READY_INSTANCE
from corral.scheduler import offer_filters
from corral.scheduler.codec import offer_from_json
from corral.scheduler.types import FleetSlot, InstanceSlot, Offer
from corral.store import exports as export_store
from corral.store import project_state
from corral.store import snapshot as snap
from corral.workers.reserved_offers import ReservedOffers

#: A fleet's instances as last made into slots: the records' tuple, the slots, and each record with its slot by id.
_Made = dict[str, tuple[InstanceRec, "InstanceSlot | None"]]
_MadeSlots = tuple[tuple[InstanceRec, ...], tuple[InstanceSlot, ...], _Made]


@dataclass(frozen=True)
class FleetFacts:
    """What the slots of the fleets one load read are built from besides the fleets."""

    #: fleet id -> ids of the projects it is exported to.
    importers: Mapping[str, frozenset[str]] = field(default_factory=dict)
    #: project id -> the backend types it has: a fleet gets offers only from those.
    project_backends: Mapping[str, frozenset[str]] = field(default_factory=dict)
    #: project id -> backend type -> the regions the project's backend names (offers come from those).
    project_regions: Mapping[str, Mapping[str, frozenset[str]]] = field(default_factory=dict)


async def read_facts(conn: Any, project_ids: list[str] | None = None, importer: str | None = None) -> FleetFacts:
    """Who imports the fleets of ``project_ids`` (None: all; with ``importer``, only whether that project does),
    and the projects' backends and regions."""
    importers = await export_store.fleet_importers(conn, project_ids, importer)
    backends, regions = await project_state.backends_and_regions(conn, project_ids)
    return FleetFacts(importers, backends, regions)


class SnapshotBuilder:
    """Fleets as slots: :meth:`load_for` (or the fleets and :meth:`refresh`), the reservations resolved
    (``reserved``, with no transaction open), then :meth:`fleet_slot` for each."""

    def __init__(self, computes: Mapping[str, Compute]) -> None:
        self.computes = computes
        self._fleet_reqs: dict[tuple[str, str], Requirements | None] = {}
        #: The offers of a fleet's configuration, its project's backends and regions and where its reservation is.
        self._fleet_offers: dict[str, tuple[Offer, ...]] = {}
        #: fleet id -> the record and the other inputs its slot was last made from, and that slot.
        self._slots: dict[str, tuple[FleetRec, tuple[object, ...], FleetSlot]] = {}
        #: What the scheduling worker's last pass read (:meth:`refresh`): the facts :meth:`fleet_slot` uses
        #: when it is given none.
        self.facts = FleetFacts()
        #: The fleets' and runs' capacity reservations, as EC2 said where they are.
        self.reserved = ReservedOffers(computes)
        #: fleet id -> its instances as last made into slots (the tuple), their slots, and each one's record and
        #: slot by id: records read again unchanged (``store/fleet_reader.py`` keeps them) are not made again.
        self._instance_slots: dict[str, _MadeSlots] = {}

    async def load_for(
        self, conn: Any, project_ids: list[str] | None = None, importer: str | None = None
    ) -> tuple[list[FleetRec], FleetFacts]:
        """The fleets (of ``project_ids``; None: all) and what their slots are built from, loaded for a plan:
        :meth:`fleet_slot` makes each one's slot from them (once the caller, with no transaction open, had
        their capacity reservations resolved). The builder keeps neither: another plan may load meanwhile."""
        return await snap.load_fleets(conn, project_ids), await read_facts(conn, project_ids, importer)

    async def refresh(self, conn: Any, project_ids: list[str] | None = None, importer: str | None = None) -> None:
        """Read again what the slots of the fleets are built from besides the fleets (:func:`read_facts`), as
        the facts :meth:`fleet_slot` uses by default (the scheduling worker's passes, one at a time)."""
        self.facts = await read_facts(conn, project_ids, importer)

    def keep_only(self, live_fleets: set[str]) -> None:
        """Forget what is kept of fleets that no longer exist."""
        self._fleet_reqs = {k: v for k, v in self._fleet_reqs.items() if k[0] in live_fleets}
        self._instance_slots = {k: v for k, v in self._instance_slots.items() if k in live_fleets}
        self._slots = {k: v for k, v in self._slots.items() if k in live_fleets}
        if len(self._fleet_offers) > 4 * max(len(live_fleets), 64):  # configurations gone: start again
            self._fleet_offers.clear()

    def _fleet_requirements(self, fleet: FleetRec) -> Requirements | None:
        raw = spec_configuration(fleet.spec).get("resources")
        key = (fleet.id, str(raw))
        if key not in self._fleet_reqs:
            self._fleet_reqs[key] = (
                config.ResourcesSpec.model_validate(raw).to_requirements() if raw is not None else None
            )
        return self._fleet_reqs[key]

    def fleet_offers(self, fleet: FleetRec, facts: FleetFacts | None = None) -> tuple[Offer, ...]:
        """The backends' offers the fleet's ``backends`` and ``resources`` allow (cached per fleet spec:
        backends' offers do not change while the server runs)."""
        conf = spec_configuration(fleet.spec)
        if conf.get("ssh_config"):
            return ()
        facts = facts or self.facts
        backends = facts.project_backends.get(fleet.project_id, frozenset())
        regions = facts.project_regions.get(fleet.project_id, {})
        # what the offers are made of, whichever fleet it is: fleets configured alike (but for their names) share them
        key = repr(
            (
                sorted(backends),
                sorted((k, sorted(v)) for k, v in regions.items()),
                sorted((k, v) for k, v in conf.items() if k != "name"),
                self.reserved.known(fleet),
            )
        )
        cached = self._fleet_offers.get(key)
        if cached is None:
            cached = self._fleet_offers[key] = self._match_offers(fleet, conf, backends, regions)
        return cached

    def _match_offers(
        self,
        fleet: FleetRec,
        conf: Mapping[str, Any],
        backends: frozenset[str],
        regions: Mapping[str, frozenset[str]],
    ) -> tuple[Offer, ...]:
        allowed = conf.get("backends")
        offers: list[Offer] = []
        for name in usable_computes(self.computes, backends):
            if allowed and name not in allowed and not ({"local", "remote"} & set(allowed)):
                continue
            offers.extend(self.computes[name].offers())
        req = self._fleet_requirements(fleet)
        if req is not None:
            offers = [o for o in offers if match_requirements(req, o.resources) is None]
        offers = offer_filters.in_project_regions(offers, regions)
        offers = self.reserved.narrowed(fleet, offers)  # a ``reservation``'s type in its region
        # ``backends`` was applied above (with its own rule for ``local``/``remote``)
        return tuple(offer_filters.filtered(offers, offer_filters.from_conf({**conf, "backends": None})))

    def fleet_slot(self, fleet: FleetRec, facts: FleetFacts | None = None) -> FleetSlot:
        """The fleet as the scheduler sees it, from ``facts`` (default: the last :meth:`refresh`'s): the slot made
        last time while the record is the same object (``store/fleet_reader.py`` keeps those) and the facts about
        it are the same."""
        facts = facts or self.facts
        inputs = (
            facts.importers.get(fleet.id, frozenset()),
            facts.project_backends.get(fleet.project_id, frozenset()),
            facts.project_regions.get(fleet.project_id, {}),
            self.reserved.known(fleet),
        )
        kept = self._slots.get(fleet.id)
        if kept is not None and kept[0] is fleet and kept[1] == inputs:
            return kept[2]
        slot = self._make_slot(fleet, facts)
        self._slots[fleet.id] = (fleet, inputs, slot)
        return slot

    def _make_slot(self, fleet: FleetRec, facts: FleetFacts) -> FleetSlot:
        nodes_min, nodes_max = nodes_bounds(fleet.spec)
        return FleetSlot(
            id=fleet.id,
            project_id=fleet.project_id,
            name=fleet.name,
            nodes_min=nodes_min,
            nodes_max=nodes_max,
            blocks=fleet_blocks(fleet.spec),
            placement=fleet_placement(fleet.spec),
            offers=self.fleet_offers(fleet, facts),
            instances=self._slots_of(fleet),
            backend_limit_key="local",
            project_name=fleet.project_name,
            importer_project_ids=facts.importers.get(fleet.id, frozenset()),
            reservation=self.reserved.reservation(fleet),
        )

    def _slots_of(self, fleet: FleetRec) -> tuple[InstanceSlot, ...]:
        """The fleet's instances as slots (its terminated ones left out), each made once per record."""
        kept = self._instance_slots.get(fleet.id)
        if kept is not None and kept[0] is fleet.instances:
            return kept[1]
        made = kept[2] if kept is not None else {}
        now: _Made = {}
        for i in fleet.instances:
            old = made.get(i.id)
            now[i.id] = old if old is not None and old[0] is i else (i, instance_slot(fleet.id, i))
        slots = tuple(slot for _, slot in now.values() if slot is not None)
        self._instance_slots[fleet.id] = (fleet.instances, slots, now)
        return slots


def instance_slot(fleet_id: str, i: InstanceRec) -> InstanceSlot | None:
    """An instance as the scheduler sees it (None: terminated)."""
    if i.status == "terminated":
        return None
    offer = offer_from_json(i.offer) if i.offer else None
    return InstanceSlot(
        id=i.id,
        fleet_id=fleet_id,
        name=i.name,
        instance_num=i.instance_num,
        # a host removed from its fleet while busy takes no new work: it leaves once free
        status="terminating" if i.termination_reason and i.status in READY_INSTANCE else i.status,
        resources=offer.resources if offer else None,
        total_blocks=i.total_blocks or 1,
        busy_blocks=i.busy_blocks,
        unreachable=i.unreachable,
        price=i.price or 0.0,
        hostname=i.hostname,
        addresses=tuple((i.agent or {}).get("addresses") or ([i.hostname] if i.hostname else [])),
        backend=i.backend,
        host_blocks=offer.host_blocks if offer else 0,
        offer=offer,
    )
