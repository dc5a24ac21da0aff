"""The one offer filter: what a plan lists (``offer_filters.passes`` over a project's offers) and what the
scheduler may place a job on (``fleet_view.as_job_sees_it``) agree for any offers, instances and run
options; the options behave as dstack's (``remote`` is local and SSH hosts, regions and instance types
compared regardless of case and not applied to hosts that are where they are)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.domain.resources import InstanceResources, Requirements
from corral.scheduler import offer_filters
from corral.scheduler.fleet_view import as_job_sees_it
from corral.scheduler.schedule import schedule
from corral.scheduler.types import FleetSlot, InstanceSlot, Offer, QueuedJob, Reserve, Snapshot, WaitPolicy

BACKENDS = ("aws", "local", "ssh")
REGIONS = ("us-east-1", "eu-west-1", "US-WEST-2")
TYPES = ("m7i.large", "c7i.xlarge", "G5.xlarge")

offers_st = st.builds(
    Offer,
    backend=st.sampled_from(BACKENDS),
    instance_type=st.sampled_from(TYPES),
    region=st.sampled_from(REGIONS),
    price=st.sampled_from((0.05, 0.1, 0.5, 2.0)),
    resources=st.builds(
        InstanceResources,
        cpus=st.just(8),
        memory_mib=st.just(32768),
        gpus=st.just(()),
        spot=st.booleans(),
        disk_size_mib=st.just(200 * 1024),
    ),
)
options_st = st.fixed_dictionaries(
    {
        "backends": st.none() | st.lists(st.sampled_from(("aws", "remote", "local")), min_size=1, max_size=2),
        "regions": st.none() | st.lists(st.sampled_from((*REGIONS, "us-west-2", "EU-WEST-1")), min_size=1),
        "instance_types": st.none() | st.lists(st.sampled_from((*TYPES, "g5.xlarge")), min_size=1),
        "max_price": st.none() | st.sampled_from((0.05, 0.3, 5.0)),
        "spot_policy": st.none() | st.sampled_from(("spot", "on-demand", "auto")),
    }
)


def _job(f: offer_filters.OfferFilter) -> QueuedJob:
    return QueuedJob(
        id="j", run_id="r", project_id="p", run_name="r", job_num=0, priority=0, submitted_at=0.0,
        requirements=Requirements(), fleet_names=None, creation_policy="reuse-or-create", wait=WaitPolicy(True),
        backends=f.backends, max_price=f.max_price, regions=f.regions, instance_types=f.instance_types, spot=f.spot,
    )  # fmt: skip


def _fleet(offers: list[Offer], instances: list[Offer]) -> FleetSlot:
    slots = tuple(
        InstanceSlot(id=f"i{n}", fleet_id="f", name=f"f-{n}", instance_num=n, status="idle", resources=o.resources,
                     total_blocks=1, busy_blocks=0, price=o.price, backend=o.backend, offer=o)
        for n, o in enumerate(instances)
    )  # fmt: skip
    return FleetSlot(id="f", project_id="p", name="f", nodes_min=0, nodes_max=None, blocks=1, placement="any",
                     offers=tuple(offers), instances=slots)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(offers_st, max_size=8), st.lists(offers_st, max_size=4), options_st)
def test_listing_and_placement_agree(offers: list[Offer], instances: list[Offer], options: dict[str, Any]) -> None:
    f = offer_filters.run_filter(SimpleNamespace(**options))  # a run's merged profile
    listed = offer_filters.filtered(offers, f)
    seen = as_job_sees_it(_job(f), _fleet(offers, instances))
    assert list(seen.offers) == listed
    # instances are narrowed by where they are, what they are and spot or on-demand (never by price: they are
    # paid for)
    kept = [i.offer for i in seen.instances if i.offer is not None]
    assert kept == [o for o in instances if offer_filters.instance_passes(o, f)]
    assert all(f.spot is None or o.resources.spot == f.spot for o in kept)
    # and a job placed on a new instance gets a listed offer (or none at all, when nothing is listed)
    plan = schedule(Snapshot(fleets=(_fleet(offers, []),), queue=(_job(f),)), now=0.0)
    reserved = [d.offer for g in plan.gangs for d in g.decisions if isinstance(d, Reserve)]
    assert all(o in listed for o in reserved)
    assert bool(reserved) == bool(listed)


def test_the_options_as_dstack_applies_them() -> None:
    res = InstanceResources(cpus=2, memory_mib=8192, gpus=())
    aws = Offer("aws", "m7i.large", "us-east-1", 0.1, res)
    local = Offer("local", "local", "local", 0.0, res)
    f = offer_filters.from_options(regions=["US-EAST-1"], instance_types=["M7I.large"])
    assert offer_filters.passes(aws, f) and offer_filters.passes(local, f)
    assert not offer_filters.passes(aws, offer_filters.from_options(regions=["eu-west-1"]))
    assert offer_filters.passes(local, offer_filters.from_options(regions=["eu-west-1"]))  # hosts stay put
    assert offer_filters.from_options(backends=["remote"]).backends == frozenset({"local", "ssh"})
    assert not offer_filters.passes(aws, offer_filters.from_options(spot_policy="spot"))
    assert offer_filters.passes(aws, offer_filters.from_options(spot_policy="auto"))
    assert offer_filters.from_options(spot_policy="on-demand").spot is False
    # dstack's default for runs and fleets alike: on-demand; auto: either
    assert offer_filters.from_options().spot is False and offer_filters.from_conf({}).spot is False
    assert offer_filters.from_options(spot_policy="auto").spot is None
    spot = Offer("aws", "m7i.large", "us-east-1", 0.03, dataclasses.replace(res, spot=True))
    assert offer_filters.instance_passes(spot, offer_filters.from_options(spot_policy="spot"))
    assert not offer_filters.instance_passes(spot, offer_filters.from_options())
    assert not offer_filters.instance_passes(aws, offer_filters.from_options(spot_policy="spot"))
    regions = offer_filters.project_regions([{"type": "aws", "regions": ["eu-west-1"]}, {"type": "local"}])
    assert offer_filters.in_project_regions([aws, local], regions) == [local]


def test_a_slurm_backends_regions_are_its_clusters() -> None:
    res = InstanceResources(cpus=4, memory_mib=16000, gpus=())
    mine, theirs = Offer("slurm", "n1", "hpc-a", 0.0, res, zone="cpu"), Offer("slurm", "n1", "hpc-b", 0.0, res)
    stored: list[Any] = [
        {"type": "slurm", "clusters": [{"name": "hpc-a"}, "not a cluster"]},
        "not a backend",
        {"type": ""},
    ]
    regions = offer_filters.project_regions(stored)
    assert regions == {"slurm": frozenset({"hpc-a"})}
    assert offer_filters.in_project_regions([mine, theirs], regions) == [mine]


def test_a_runs_reservation_narrows_new_instances_as_dstacks_does() -> None:
    res = InstanceResources(cpus=2, memory_mib=8192, gpus=())
    there = Offer("aws", "c7i.xlarge", "us-east-1", 0.2, res)
    elsewhere = Offer("aws", "c7i.xlarge", "eu-west-1", 0.2, res)
    other_type = Offer("aws", "m7i.large", "us-east-1", 0.1, res)
    spot = dataclasses.replace(there, resources=dataclasses.replace(res, spot=True))
    local = Offer("local", "local", "local", 0.0, res)
    offers = [there, elsewhere, other_type, spot, local]
    job = dataclasses.replace(_job(offer_filters.OfferFilter()), reservation="cr-1")
    places = frozenset({("us-east-1", "c7i.xlarge")})
    seen = as_job_sees_it(dataclasses.replace(job, reserved_places=places), _fleet(offers, [other_type]))
    assert seen.offers == (there,) and seen.narrowed_by == ("reservation",)
    assert [i.offer for i in seen.instances] == [other_type]  # instances already there are reused
    # not looked up yet: any on-demand aws offer (the launch checks); a fleet naming another: none
    assert as_job_sees_it(job, _fleet(offers, [])).offers == (there, elsewhere, other_type)
    other = dataclasses.replace(_fleet(offers, []), reservation="cr-2")
    assert as_job_sees_it(dataclasses.replace(job, reserved_places=places), other).offers == ()
    same = dataclasses.replace(_fleet(offers, []), reservation="cr-1")
    assert as_job_sees_it(dataclasses.replace(job, reserved_places=places), same).offers == (there,)


def test_a_jobs_volume_zone_pins_new_instances_and_excludes_other_zones() -> None:
    res = InstanceResources(cpus=2, memory_mib=8192, gpus=(), disk_size_mib=200 * 1024)
    offer = Offer("aws", "m7i.large", "us-east-1", 0.1, res)
    in_a, in_b = dataclasses.replace(offer, zone="us-east-1a"), dataclasses.replace(offer, zone="us-east-1b")
    f = offer_filters.OfferFilter(backends=frozenset({"aws"}), regions=frozenset({"us-east-1"}),
                                  zones=frozenset({"us-east-1b"}))  # fmt: skip
    job = dataclasses.replace(_job(f), zones=f.zones)
    seen = as_job_sees_it(job, _fleet([offer], [in_a, in_b]))
    assert [i.offer for i in seen.instances] == [in_b]  # an idle instance elsewhere cannot take the volume
    assert seen.offers == (in_b,) and "volumes" in seen.narrowed_by  # a new one is launched in the zone
    busy = _fleet([offer], [])
    plan = schedule(Snapshot(fleets=(busy,), queue=(job,)), now=0.0)
    reserved = [d.offer for g in plan.gangs for d in g.decisions if isinstance(d, Reserve)]
    assert reserved == [in_b]
    assert not offer_filters.passes(in_a, f) and offer_filters.passes(offer, f)


def test_a_configurations_options_allow_an_offer_as_the_filter_of_those_options_does() -> None:
    offer = Offer("aws", "G5.xlarge", "us-east-1", 0.5, InstanceResources(cpus=8, memory_mib=32768))
    assert offer_filters.allowed(offer, {"backends": ["aws"], "regions": ["US-EAST-1"], "max_price": 1.0})
    assert not offer_filters.allowed(offer, {"instance_types": ["m7i.large"]})
    assert not offer_filters.allowed(offer, {"spot_policy": "spot"})
    assert offer_filters.allowed(offer, {})


def test_a_run_profiles_options_make_its_filter() -> None:
    profile = SimpleNamespace(
        backends=["remote"], regions=["EU-west-1"], instance_types=None, max_price=1, spot_policy=None
    )
    f = offer_filters.run_filter(profile)
    assert f == offer_filters.OfferFilter(frozenset({"local", "ssh"}), frozenset({"eu-west-1"}), None, 1.0, False)


def test_an_offer_passes_only_the_backends_and_price_a_filter_allows() -> None:
    res = InstanceResources(cpus=8, memory_mib=32768)
    cheap, dear = Offer("aws", "m7i", "us-east-1", 0.1, res), Offer("aws", "m7i", "us-east-1", 5.0, res)
    local = Offer("local", "local", "local", 0.0, res)
    only_aws = offer_filters.OfferFilter(backends=frozenset({"aws"}))
    under_one = offer_filters.OfferFilter(max_price=1.0)
    assert offer_filters.filtered([cheap, dear, local], only_aws, under_one) == [cheap]
    assert offer_filters.filtered([cheap, dear, local]) == [cheap, dear, local]


def test_an_offer_is_pinned_to_the_first_allowed_zone_only_when_it_names_none() -> None:
    res = InstanceResources(cpus=8, memory_mib=32768)
    anywhere = Offer("aws", "m7i", "us-east-1", 0.1, res)
    zoned = dataclasses.replace(anywhere, zone="us-east-1c")
    f = offer_filters.OfferFilter(zones=frozenset({"us-east-1b", "us-east-1a"}))
    assert offer_filters.pinned(anywhere, f).zone == "us-east-1a"
    assert offer_filters.pinned(zoned, f) is zoned
    assert offer_filters.pinned(anywhere, offer_filters.OfferFilter()) is anywhere
    # a job whose volume alternatives are in two regions: each region's offer goes to that region's zone
    two = offer_filters.OfferFilter(zones=frozenset({"eu-west-1a", "us-east-1b"}))
    assert offer_filters.pinned(anywhere, two).zone == "us-east-1b"
    assert offer_filters.pinned(dataclasses.replace(anywhere, region="eu-west-1"), two).zone == "eu-west-1a"


def test_a_fleets_availability_zones_narrow_its_offers_to_their_regions() -> None:
    zoned = offer_filters.from_conf({"availability_zones": ["us-east-1b", "us-west-2a"]})
    assert zoned.regions == frozenset({"us-east-1", "us-west-2"})
    # the fleet's own regions, when it sets them, are what narrow (the zones are checked to be in them)
    own = offer_filters.from_conf({"regions": ["us-east-1"], "availability_zones": ["us-east-1b"]})
    assert own.regions == frozenset({"us-east-1"})
    assert offer_filters.from_conf({"availability_zones": []}).regions is None
