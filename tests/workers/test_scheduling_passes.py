"""The worker's choice of pass: over the queue's head while the fleets are those the last pass saw and a
whole pass was made within the safety-net interval (with or without projects' policies), else a whole pass."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scheduler"))

from test_head_pass import drain_snapshot
from test_schedule import inst, job

from corral.scheduler.schedule import schedule
from corral.scheduler.types import Assign, FairShare, Plan, Snapshot, Wait
from corral.workers.scheduling_passes import PassChoice

INTERVAL = 5.0


def _kinds(plan: Plan) -> list[str]:
    return [type(d).__name__ for g in plan.gangs for d in g.decisions]


def _told(plan: Plan) -> list[tuple[str, str | None]]:
    return [(type(d).__name__, getattr(d, "job_id", None)) for g in plan.gangs for d in g.decisions]


def _settled_after_first(choice: PassChoice, snapshot: Snapshot, now: float) -> Plan:
    plan = choice.plan(snapshot, now, preemption=False)
    choice.planned(plan, [j.id for j in snapshot.queue])
    return plan


def _next(snapshot: Snapshot) -> Snapshot:
    """The first job placed on the one free instance; its end freed that instance again, the rest waits."""
    return replace(snapshot, queue=snapshot.queue[1:])


def test_a_pass_over_the_same_fleets_works_out_the_head_only() -> None:
    choice = PassChoice(INTERVAL)
    first = drain_snapshot(50, busy=3)
    whole = _settled_after_first(choice, first, 100.0)
    assert _kinds(whole) == ["Assign"] + ["Wait"] * 49  # the first pass is whole: every job told to wait
    head = choice.plan(_next(first), 101.0, preemption=False)
    assert [d for g in head.gangs for d in g.decisions] == [Assign("j1-0", "i3", 1)]  # the waits are skipped
    assert isinstance(schedule(_next(first), 101.0).gangs[-1].decisions[0], Wait)


def test_under_fair_share_too_a_pass_over_the_same_fleets_skips_the_waits() -> None:
    choice = PassChoice(INTERVAL)
    first = replace(drain_snapshot(50, busy=3), shares={"p": FairShare(weight=2.0)})
    whole = _settled_after_first(choice, first, 100.0)
    assert _kinds(whole) == ["Assign"] + ["Wait"] * 49
    said = {d.job_id: d.message for g in whole.gangs for d in g.decisions if isinstance(d, Wait)}
    later = _next(first)
    later = replace(later, queue=tuple(replace(j, status_message=said[j.id]) for j in later.queue))
    head = choice.plan(later, 101.0, preemption=False)
    # the next job is placed; the first settled gang after it is worked out (its kind finds no room, and it was
    # told so already), and the rest of the project's queue is left out
    assert [d for g in head.gangs for d in g.decisions] == [Assign("j1-0", "i3", 1)]
    assert head == schedule(later, 101.0)  # the same plan as the whole pass's
    # without their messages the whole pass would tell all 48 again; the head pass only the one it worked out
    untold = choice.plan(_next(first), 101.0, preemption=False)
    assert _told(untold) == [("Assign", "j1-0"), ("Wait", "j2-0")]
    assert len(schedule(_next(first), 101.0).gangs) == 49


def test_new_fleets_the_safety_net_or_preemption_make_a_whole_pass() -> None:
    first = drain_snapshot(50, busy=3)
    later = _next(first)
    grown = replace(later, fleets=(replace(later.fleets[0], instances=(*later.fleets[0].instances, inst(4))),))
    for snapshot, now, preemption in ((grown, 101.0, False), (later, 100.0 + INTERVAL, False), (later, 101.0, True)):
        choice = PassChoice(INTERVAL)
        _settled_after_first(choice, first, 100.0)
        plan = choice.plan(snapshot, now, preemption=preemption)
        assert plan == schedule(snapshot, now), (snapshot is grown, now, preemption)
        assert "Wait" in _kinds(plan)


def test_a_job_that_came_since_the_last_pass_is_worked_out_and_one_decided_stays_pending() -> None:
    choice = PassChoice(INTERVAL)
    first = drain_snapshot(50, busy=3)
    _settled_after_first(choice, first, 100.0)
    came = job(50)
    later = replace(_next(first), queue=(*_next(first).queue, came))
    choice.came([came.id])
    plan = choice.plan(later, 101.0, preemption=False)
    assert _told(plan) == [
        ("Assign", "j1-0"),
        ("Wait", came.id),
    ]
    # the commit refused the placement: the next pass works that job out again, the new one is settled
    choice.planned(plan, [j.id for j in later.queue])
    again = choice.plan(later, 102.0, preemption=False)
    assert _told(again) == [("Assign", "j1-0")]


def test_a_project_that_comes_into_the_queue_makes_a_whole_pass() -> None:
    """Its jobs change the fair-share notes of the others' waits: the whole pass tells them again."""
    choice = PassChoice(INTERVAL)
    first = replace(drain_snapshot(10, busy=4), shares={"p": FairShare(used={"cpu": 4.0}), "q": FairShare()})
    _settled_after_first(choice, first, 100.0)
    other = replace(job(20), project_id="q", project_name="q")
    later = replace(first, queue=(*first.queue, other))
    choice.came([other.id])
    whole = schedule(later, 101.0)
    assert len(whole.gangs) == 11  # every wait told again, naming the project that came
    assert choice.plan(later, 101.0, preemption=False) == whole


def test_a_costly_whole_pass_is_made_again_only_after_twenty_times_its_cost() -> None:
    """The safety net's whole pass over a long queue costs what the queue is long: it is spaced by its own cost,
    so that it takes at most a twentieth of the worker's time."""
    ticks = iter([0.0, 0.5, 10.0, 10.01])  # the first whole pass takes 0.5 s, the second 10 ms
    choice = PassChoice(INTERVAL, clock=lambda: next(ticks))
    first = drain_snapshot(50, busy=3)
    _settled_after_first(choice, first, 100.0)
    assert choice.whole_interval() == 10.0  # 20 x 0.5 s, above the 5 s interval
    later = _next(first)
    head = choice.plan(later, 100.0 + INTERVAL, preemption=False)
    assert _kinds(head) == ["Assign"], "past the interval but within 20 times the cost: a head pass"
    choice.planned(head, [j.id for j in later.queue])
    whole = choice.plan(later, 110.0, preemption=False)
    assert whole == schedule(later, 110.0) and "Wait" in _kinds(whole)
    assert choice.whole_interval() == INTERVAL  # a cheap whole pass: the interval again
