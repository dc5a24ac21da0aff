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
