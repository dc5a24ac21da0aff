"""A fleet as a job sees it: what its run options leave of the fleet's instances and offers."""

from __future__ import annotations

from dataclasses import replace

from test_schedule import MACHINE, fleet, inst, job

from corral.scheduler.fleet_view import as_job_sees_it, run_backends
from corral.scheduler.types import Offer


def test_a_runs_remote_backend_means_local_and_ssh_hosts() -> None:
    assert run_backends(["remote"]) == frozenset({"local", "ssh"})
    assert run_backends(["aws", "remote"]) == frozenset({"aws", "local", "ssh"})


def test_a_reservation_that_every_offer_may_serve_leaves_the_fleet_as_it_is() -> None:
    f = fleet(offers=(Offer("aws", "p5.48xlarge", "us-east-1", 98.0, MACHINE),))
    seen = as_job_sees_it(replace(job(1), reservation="cr-1"), f)
    assert seen is f and seen.narrowed_by == ()


def test_a_reservation_narrows_to_its_places_and_says_so() -> None:
    here = Offer("aws", "p5.48xlarge", "us-east-1", 98.0, MACHINE)
    there = Offer("aws", "p5.48xlarge", "eu-west-1", 98.0, MACHINE)
    f = fleet(offers=(here, there))
    seen = as_job_sees_it(
        replace(job(1), reservation="cr-1", reserved_places=frozenset({("us-east-1", "p5.48xlarge")})), f
    )
    assert seen.offers == (here,) and seen.narrowed_by == ("reservation",)


def test_a_host_being_set_up_stays_whatever_the_runs_regions() -> None:
    setting_up = replace(inst(0, status="pending"), resources=None, offer=None)
    placed = replace(inst(1), offer=Offer("aws", "m7i", "eu-west-1", 1.0, MACHINE))
    f = fleet((setting_up, placed), offers=())
    seen = as_job_sees_it(replace(job(1), regions=frozenset({"us-east-1"})), f)
    assert seen.instances == (setting_up,) and seen.narrowed_by == ("regions",)


def test_options_that_leave_everything_in_place_leave_the_fleet_as_it_is() -> None:
    here = Offer("aws", "m7i", "us-east-1", 1.0, MACHINE)
    f = fleet((replace(inst(0), offer=here, backend="aws"),), offers=(here,))
    assert as_job_sees_it(replace(job(1), regions=frozenset({"us-east-1"})), f) is f
    assert as_job_sees_it(replace(job(1), barred_backends=frozenset({"local"})), f) is f


def test_a_spot_only_run_sees_no_on_demand_offers_and_says_why() -> None:
    on_demand = Offer("aws", "m7i", "us-east-1", 1.0, MACHINE)
    seen = as_job_sees_it(replace(job(1), spot=True), fleet(offers=(on_demand,)))
    assert seen.offers == () and seen.narrowed_by == ("spot_policy",)


def test_a_barred_backend_withholds_its_instances_and_offers() -> None:
    local = Offer("local", "local", "local", 0.0, MACHINE)
    f = fleet((replace(inst(0), backend="local"),), offers=(local,))
    seen = as_job_sees_it(replace(job(1), barred_backends=frozenset({"local"})), f)
    assert (seen.instances, seen.offers, seen.withheld_backends) == ((), (), frozenset({"local"}))
