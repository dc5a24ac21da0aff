"""The one offer filter, as dstack applies a run's or fleet's options to offers and instances: ``backends``
(dstack's names; ``remote`` is corral's local and SSH hosts), ``regions``, ``instance_types``, ``max_price``
(dollars an hour) and ``spot_policy`` (dstack's default for runs and fleets alike: ``on-demand``; ``auto``:
either). Listings (``runs/get_plan``, ``fleets/get_plan``, ``gpus/list``,
``corral offer``) and placement (``fleet_view``) both go through :func:`passes`, so what a plan lists is
what the scheduler may provision. A project's offers are also narrowed to the regions its own backends
name (:func:`in_project_regions`). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from corral.scheduler.types import Offer

#: corral's backend names that a ``backends`` entry (dstack's names) stands for.
_WIRE_TO_CORRAL = {"remote": ("local", "ssh")}
#: Backends whose hosts are where they are: ``regions`` and ``instance_types`` do not apply to them.
_PLACED = ("local", "ssh")


@dataclass(frozen=True)
class OfferFilter:
    """The options that narrow offers (None: no narrowing). ``backends`` in corral's names; ``regions`` and
    ``instance_types`` lower-cased (dstack compares them regardless of case)."""

    backends: frozenset[str] | None = None
    regions: frozenset[str] | None = None
    instance_types: frozenset[str] | None = None
    max_price: float | None = None
    #: True: spot offers only; False: on-demand only; None (``auto``, or not set): either.
    spot: bool | None = None
    #: The availability zones allowed (a job's network volumes': EBS attaches only in its own zone). An
    #: instance passes when it is in one; an offer when it is in one or names none (it is then pinned).
    zones: frozenset[str] | None = None


def corral_backends(names: Iterable[str]) -> frozenset[str]:
    """corral's backend names that a ``backends`` option (dstack's names) allows."""
    out: set[str] = set()
    for n in names:
        out.update(_WIRE_TO_CORRAL.get(str(n), (str(n),)))
    return frozenset(out)


#: The ``spot_policy`` of a run or fleet that sets none (dstack's, for every run type and for fleets).
DEFAULT_SPOT_POLICY = "on-demand"


def spot_of(policy: Any) -> bool | None:
    """A ``spot_policy`` (enum member, string or None: the default) as a filter's ``spot``: True (``spot``),
    False (``on-demand``), None (``auto``: either)."""
    value = getattr(policy, "value", policy)
    return {"spot": True, "on-demand": False}.get(str(value if value is not None else DEFAULT_SPOT_POLICY))


def from_options(
    backends: Iterable[Any] | None = None,
    regions: Iterable[str] | None = None,
    instance_types: Iterable[str] | None = None,
    max_price: float | None = None,
    spot_policy: Any = None,
) -> OfferFilter:
    """The filter of a configuration's (or profile's) options, as they come: enum members or strings."""
    return OfferFilter(
        backends=None if backends is None else corral_backends(getattr(b, "value", b) for b in backends),
        regions=frozenset(str(r).lower() for r in regions) if regions else None,
        instance_types=frozenset(str(t).lower() for t in instance_types) if instance_types else None,
        max_price=None if max_price is None else float(max_price),
        spot=spot_of(spot_policy),
    )


def run_filter(profile: Any) -> OfferFilter:
    """The filter of a run's merged profile (the configuration's options over the profile's)."""
    return from_options(
        profile.backends, profile.regions, profile.instance_types, profile.max_price, profile.spot_policy
    )


def from_conf(conf: Mapping[str, Any]) -> OfferFilter:
    """The filter of a configuration as JSON (a fleet's stored spec, say). A fleet's ``availability_zones``
    without ``regions`` narrows offers to the zones' regions (an availability zone's name is its region's and a
    letter: ``us-east-1a``), where its instances can launch."""
    zones = conf.get("availability_zones")
    regions = conf.get("regions") or ([str(z)[:-1] for z in zones] if zones else None)
    return from_options(
        conf.get("backends"), regions, conf.get("instance_types"), conf.get("max_price"), conf.get("spot_policy")
    )


def instance_passes(offer: Offer, f: OfferFilter) -> bool:
    """Whether an instance that is ``offer`` (its stored one) passes ``f``: where and what it is, and spot
    or on-demand (a spot-only run never lands on an on-demand instance, nor an on-demand run on spot)."""
    if f.spot is not None and offer.resources.spot != f.spot:
        return False
    if f.zones is not None and offer.zone not in f.zones:
        return False
    return place_passes(offer.backend, offer.region, offer.instance_type, f)


def place_passes(backend: str, region: str, instance_type: str, f: OfferFilter) -> bool:
    """Whether an instance (or offer) of ``backend`` in ``region`` of ``instance_type`` passes ``f``'s
    ``backends``, ``regions`` and ``instance_types`` (what applies to instances already there too)."""
    if f.backends is not None and backend not in f.backends:
        return False
    if backend in _PLACED:
        return True
    if f.regions is not None and region.lower() not in f.regions:
        return False
    return f.instance_types is None or instance_type.lower() in f.instance_types


def passes(offer: Offer, f: OfferFilter) -> bool:
    """Whether ``offer`` passes every option of ``f``."""
    if f.max_price is not None and offer.price > f.max_price:
        return False
    if f.spot is not None and offer.resources.spot != f.spot:
        return False
    if f.zones is not None and offer.zone and offer.zone not in f.zones:
        return False
    return place_passes(offer.backend, offer.region, offer.instance_type, f)


def pinned(offer: Offer, f: OfferFilter) -> Offer:
    """``offer`` in the first of ``f``'s zones when it names none (where the instance must be launched): the
    first of its own region's, when some are (an availability zone's name is its region's and a letter)."""
    if f.zones and not offer.zone:
        own = [z for z in f.zones if z.startswith(offer.region)]
        return replace(offer, zone=min(own or f.zones))
    return offer


def allowed(offer: Offer, conf: Mapping[str, Any]) -> bool:
    """Whether ``offer`` passes the filters a run's or fleet's configuration (as JSON) sets."""
    return passes(offer, from_conf(conf))


def filtered(offers: Iterable[Offer], *filters: OfferFilter) -> list[Offer]:
    """``offers`` that pass every one of ``filters`` (a run's and its fleet's, say)."""
    return [o for o in offers if all(passes(o, f) for f in filters)]


def project_regions(backends: Iterable[Mapping[str, Any]]) -> dict[str, frozenset[str]]:
    """Backend type -> the regions a project's stored backends name (types without ``regions``: absent). A
    ``slurm`` backend's regions are its clusters' names (dstack: a cluster is a region)."""
    out: dict[str, frozenset[str]] = {}
    for b in backends:
        if not isinstance(b, Mapping) or not b.get("type"):
            continue
        kind = str(b["type"])
        if kind == "slurm":
            names = {str(c.get("name")) for c in b.get("clusters") or [] if isinstance(c, Mapping)}
            out[kind] = out.get(kind, frozenset()) | names
        elif b.get("regions"):
            out[kind] = out.get(kind, frozenset()) | {str(r) for r in b["regions"]}
    return out


def in_project_regions(offers: Iterable[Offer], regions: Mapping[str, frozenset[str]]) -> list[Offer]:
    """``offers`` in the regions the project's backend of their type names (all, where it names none)."""
    return [o for o in offers if o.backend not in regions or o.region in regions[o.backend]]
