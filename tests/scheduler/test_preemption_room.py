"""The room preemption works in: blocks given back by victims (and their usage against quotas), blocks a
plan takes, blocks held for other runs' preemptors, and what a plan's placements charge."""

from __future__ import annotations

from dataclasses import replace

from test_preemption import GPU, cluster, running, waiting
from test_schedule import OFFER, fleet, inst

from corral.domain.quotas import Limits, charge
from corral.scheduler.preemption import WITHIN_PROJECT, Preemption
from corral.scheduler.preemption_room import booked, charge_of, freed, held_for_others, held_for_preemptors
from corral.scheduler.types import Assign, Gang, Plan, ProjectQuota, Reserve, Snapshot


def busy(snap: Snapshot) -> dict[str, tuple[int, str]]:
    return {i.id: (i.busy_blocks, i.status) for f in snap.fleets for i in f.instances}


def test_blocks_held_for_other_runs_are_not_free_and_a_runs_own_are() -> None:
    snap = cluster(2, [])
    held = {"r9": {"i0": 1}, "r8": {"i0": 1, "i1": 2}}
    assert busy(held_for_others(snap, held, "r9")) == {"i0": (1, "busy"), "i1": (2, "busy")}
    assert held_for_others(snap, {"r9": {"i0": 2}}, "r9") is snap


def test_a_victim_gives_back_its_blocks_and_its_usage_against_its_projects_quota() -> None:
    victim = running(0, 0)
    snap = replace(
        cluster(2, [victim, running(1, 0)]),
        quotas={"p": ProjectQuota(Limits({"gpu": 4.0}), used={"gpu": 2.0})},
    )
    after = freed(snap, [victim, running(5, 1, project="q")])  # q has no quota
    assert busy(after)["i0"] == (1, "busy") and after.quotas["p"].used["gpu"] == 2.0 - GPU["gpu"]
    assert "q" not in after.quotas
    assert freed(snap, []) is snap


def test_a_fleet_untouched_by_a_change_is_the_same_fleet_and_an_instance_not_up_keeps_its_status() -> None:
    other = replace(fleet((inst(7, fleet="g", status="provisioning", total=2),), fid="g", name="g"))
    snap = replace(cluster(1, []), fleets=(*cluster(1, []).fleets, other))
    plan = Plan((Gang("r1", (Assign("j", "i0", 1),)),))
    after = booked(snap, plan)
    assert after.fleets[1] is other and busy(after)["i0"] == (1, "busy")
    pending = booked(snap, Plan((Gang("r1", (Assign("j", "i7", 2),)),)))
    assert busy(pending)["i7"] == (2, "provisioning")


def test_a_plan_charges_only_its_placements_on_known_instances() -> None:
    snap = cluster(1, [])
    plan = Plan((Gang("r1", (Assign("j1", "i0", 1), Assign("j2", "gone", 1), Reserve("f", OFFER, 1, 1, job_id="j3"))),))
    assert charge_of(snap, plan) == charge(["H200"] * 2, 16, 65536, 0.0, 1, 2)  # one of the host's two blocks
    setting_up = replace(snap, fleets=(fleet((replace(inst(0), resources=None),)),))
    assert charge_of(setting_up, Plan((Gang("r1", (Assign("j1", "i0", 1),)),))) == {}


def test_a_stopping_job_preempted_for_a_run_no_longer_waiting_holds_nothing() -> None:
    message = Preemption("v", "low", ("j",), "r9", "run-9", WITHIN_PROJECT, "p").message
    stopping = [running(0, 0, stopping=True, preempted_for=message)]
    queue = tuple(waiting(9, 90))
    snap = replace(cluster(1, stopping), queue=queue)
    assert held_for_preemptors(snap, Plan(()), stopping, 1000.0) == {"r9": {"i0": 1}}
    gone = [running(0, 0, stopping=True, preempted_for=message.replace("run-9", "run-7"))]
    assert held_for_preemptors(snap, Plan(()), gone, 1000.0) == {}
