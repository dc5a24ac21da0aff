"""Fleet upkeep: reservations that bring a fleet up to ``nodes.min``, the cheapest offer first, and on a
carved host only while the host has free blocks."""

from __future__ import annotations

from test_schedule import MACHINE, fleet, inst

from corral.scheduler.blocks import carved_offers
from corral.scheduler.fleet_upkeep import upkeep
from corral.scheduler.types import Offer, Reserve

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
