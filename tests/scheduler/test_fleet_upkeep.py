"""Fleet upkeep: reservations that bring a fleet up to ``nodes.min``, the cheapest offer first, and on a
carved host only while the host has free blocks."""

from __future__ import annotations

from dataclasses import replace

from test_schedule import MACHINE, fleet, inst, job

from corral.scheduler.blocks import carved_offers
from corral.scheduler.fleet_upkeep import reclaim_for, upkeep
from corral.scheduler.ledger import initial_ledger
from corral.scheduler.types import Offer, Reclaim, Reserve, Snapshot

CHEAP = Offer("aws", "m7i.large", "us-east-1", 0.1, MACHINE)
DEAR = Offer("aws", "m7i.xlarge", "us-east-1", 0.2, MACHINE)


def test_a_fleet_at_nodes_min_or_without_offers_needs_nothing() -> None:
    assert upkeep(fleet((inst(0), inst(1)), nodes_min=2)) == []
    assert upkeep(fleet((), nodes_min=2, offers=())) == []


def test_missing_nodes_are_reserved_from_the_cheapest_offer_with_the_others_as_fallbacks() -> None:
    out = upkeep(fleet((inst(0),), nodes_min=3, offers=(DEAR, CHEAP)))
    assert out == [Reserve("f", CHEAP, 0, 1, fallbacks=(DEAR,))] * 2


def test_a_carved_host_is_reserved_only_while_it_has_free_blocks() -> None:
    smallest = carved_offers("local", MACHINE, 4)[0]
    f = fleet((), nodes_min=3, offers=(smallest,), blocks=None)
    free = {"local": 2}
    assert len(upkeep(f, free)) == 2 and free == {"local": 0}
    assert upkeep(f, {"local": 0}) == []
    # a host whose free blocks are not known is not limited
    assert len(upkeep(f, {})) == 3 and len(upkeep(f)) == 3


def test_idle_carved_instances_are_reclaimed_largest_first_and_only_as_many_as_needed() -> None:
    carved = carved_offers("local", MACHINE, 4)
    idle = tuple(
        replace(inst(n, fleet="g", total=1), backend="local", host_blocks=2, offer=carved[1]) for n in range(2)
    )
    full = fleet((), nodes_max=0, name="full", fid="full", offers=carved)  # may not grow: skipped
    cloud_and_host = fleet((), nodes_max=None, offers=(replace(CHEAP, price=0.0), *carved))
    holder = fleet(idle, name="g", fid="g", offers=())
    snap = Snapshot((full, cloud_and_host, holder), (job(1),), host_pools={"local": (4, 4)})
    ledger = initial_ledger(snap)
    out = reclaim_for([job(1)], [full, cloud_and_host], snap, ledger)
    assert out == [Reclaim("i0", "Terminated to free this machine for run run-1")]
    assert ledger.free_blocks["i0"] == 0 and ledger.free_blocks["i1"] == 1


def test_nothing_is_reclaimed_without_shared_hosts_for_reuse_only_runs_or_pinned_runs() -> None:
    snap = Snapshot((fleet(),), (job(1),))
    assert reclaim_for([job(1)], [fleet()], snap, initial_ledger(snap)) == []
    pooled = replace(snap, host_pools={"local": (4, 4)})
    reuse = replace(job(1), creation_policy="reuse")
    assert reclaim_for([reuse], [fleet()], pooled, initial_ledger(pooled)) == []
