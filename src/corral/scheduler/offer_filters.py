"""The profile's offer filters, as dstack applies them: ``max_price`` (dollars an hour), ``regions``,
``instance_types`` and ``backends``. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from corral.scheduler.types import Offer

#: Backend names on the wire that stand for corral's own (``local`` goes out as ``remote``).
_ALIASES = {"remote": "local"}


def allowed(offer: Offer, conf: Mapping[str, Any]) -> bool:
    """Whether ``offer`` passes the filters a run's or fleet's configuration (or profile) sets."""
    max_price = conf.get("max_price")
    if max_price is not None and offer.price > float(max_price):
        return False
    regions = conf.get("regions")
    if regions and offer.region not in {str(r) for r in regions} and offer.backend not in ("local", "ssh"):
        return False
    types = conf.get("instance_types")
    if types and offer.instance_type not in {str(t) for t in types} and offer.backend not in ("local", "ssh"):
        return False
    backends = conf.get("backends")
    return not backends or offer.backend in {_ALIASES.get(str(b), str(b)) for b in backends}


def filtered(offers: Iterable[Offer], *confs: Mapping[str, Any]) -> list[Offer]:
    """``offers`` that pass every one of ``confs`` (a run's configuration and its profile, say)."""
    return [o for o in offers if all(allowed(o, c) for c in confs)]
