"""Holds: blocks a preemption freed stay for the run that preempted while it waits and the hold lasts,
even when fair-share order or age would give them to another project's run; a hold ends when its bound
passes or its run no longer waits; several victims of one run on one instance leave all their blocks held;
the preemptor is read back from the victim's stop message; and a run that holds capacity preempts nothing
more."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from test_preemption import ON, OPEN, cluster, running, waiting
from test_schedule import job

from corral.domain.quotas import Limits
from corral.scheduler.holds import HOLD_FOR, Ended, holds_for, preemptor
from corral.scheduler.preemption import RECLAIM, WITHIN_PROJECT, Preemption, choose
from corral.scheduler.schedule import schedule
from corral.scheduler.types import Assign, Fail, FairShare, Hold, Snapshot, Wait

NOW = 1000.0


def one_free() -> Snapshot:
    """Two hosts of two blocks, three busy: one block free on i1 (what a victim just gave back)."""
    snap = cluster(2, [running(0, 0), running(1, 0), running(2, 1, project="q")])
    # q holds more than p by weight, so fair share alone would take p's... here the other way: p far below
    shares = {"p": FairShare(1.0, Limits(), {"gpu": 0.0}), "q": FairShare(1.0, Limits(), {"gpu": 3.0})}
    queue = (*waiting(5, 0, project="p", at=10.0), *waiting(9, 90, project="q", at=500.0))
    return replace(snap, queue=queue, shares=shares)


def assigned(snap: Snapshot, now: float = NOW) -> dict[str, str]:
    plan = schedule(snap, now)
    return {g.run_id: d.instance_id for g in plan.gangs for d in g.decisions if isinstance(d, Assign)}


def test_the_freed_block_goes_to_its_preemptor_not_to_the_run_fair_share_prefers() -> None:
    snap = one_free()
    assert assigned(snap) == {"r5": "i1"}  # without a hold: p is furthest below its share
    held = replace(snap, holds=(Hold("i1", "r9", 1, NOW + 60),))
    assert assigned(held) == {"r9": "i1"}


def test_a_hold_ends_at_its_bound_or_when_its_run_no_longer_waits() -> None:
    snap = replace(one_free(), holds=(Hold("i1", "r9", 1, NOW),))
    assert assigned(snap) == {"r5": "i1"}  # the bound has passed
    gone = replace(snap, queue=snap.queue[:1], holds=(Hold("i1", "r9", 1, NOW + 60),))
    assert assigned(gone) == {"r5": "i1"}  # its run was placed or stopped waiting


def test_a_preemptor_that_does_not_fit_yet_keeps_what_is_held_for_it() -> None:
    snap = one_free()
    big = waiting(9, 90, gpus=2, project="q", at=500.0)
    held = replace(snap, queue=(snap.queue[0], *big), holds=(Hold("i1", "r9", 1, NOW + 60),))
    assert assigned(held) == {}  # the other block it needs still runs a victim: nobody takes the freed one


def test_holds_of_one_run_on_one_instance_add_up() -> None:
    # r9 (three GPUs) preempted two one-GPU runs of i0, both ended: both blocks of i0 are its own
    snap = cluster(2, [running(2, 1), running(3, 1)])
    big = waiting(9, 90, gpus=3, project="q", at=500.0)
    holds = (Hold("i0", "r9", 1, NOW + 60), Hold("i0", "r9", 1, NOW + 60))
    held = replace(snap, queue=(*waiting(5, 0, at=10.0), *big), holds=holds)
    assert assigned(held) == {}  # r9 does not fit yet; r5 takes neither of its blocks


def test_a_run_that_holds_capacity_preempts_nothing_more() -> None:
    victims = [running(0, 0), running(1, 0), running(2, 1, started=5.0)]
    snap = replace(cluster(2, victims), queue=tuple(waiting(9, 90, gpus=2, at=500.0)))
    plan = schedule(snap, NOW)
    assert [p.run_id for p in choose(snap, plan, victims, OPEN, ON, NOW, schedule)] == ["v2"]
    # v2 ended; a run of another project, furthest below its share, waits too: the preemptor takes i1
    snap = replace(cluster(2, victims[:2]), queue=(*waiting(4, 0, project="q", at=10.0), *snap.queue))
    snap = replace(snap, holds=(Hold("i1", "r9", 1, NOW + 60),), shares={"q": FairShare(3.0, Limits(), {})})
    plan = schedule(snap, NOW)
    assert {g.run_id: d.instance_id for g in plan.gangs for d in g.decisions if isinstance(d, Assign)} == {"r9": "i1"}
    assert choose(snap, plan, victims[:2], OPEN, ON, NOW, schedule) == ()


def test_two_victims_ended_on_one_instance_leave_both_blocks_held_while_their_preemptor_waits() -> None:
    # both blocks of i0 freed by two victims of r9, which needs more than the host and so still waits
    snap = cluster(1, [])
    holds = (Hold("i0", "r9", 1, NOW + 60), Hold("i0", "r9", 1, NOW + 60))
    snap = replace(snap, queue=(*waiting(5, 0, at=10.0), *waiting(9, 90, gpus=4, at=500.0)), holds=holds)
    assert assigned(snap) == {}
    assert assigned(replace(snap, holds=holds[:1])) == {"r5": "i0"}  # one held: the other block is free


def test_the_preemptor_is_read_back_from_the_stop_message() -> None:
    within = Preemption("v", "low", ("j",), "r9", "high", WITHIN_PROJECT, "p")
    reclaim = Preemption("v", "low", ("j",), "r9", "back", RECLAIM, "team-b")
    assert preemptor(within.message) == ("high", None)
    assert preemptor(reclaim.message) == ("back", "team-b")
    assert preemptor("Stopped by the user") is None and preemptor(None) is None
    queue = (
        *waiting(9, 90, project="p"),
        replace(waiting(8, 0, project="t")[0], run_name="back", project_name="team-b"),
    )
    ended = [
        Ended("i0", 1, "p", within.message.replace("high", "run-9"), NOW - 10),  # waiting run run-9 of p
        Ended("i1", 2, "q", reclaim.message, NOW - 10),  # run back of team-b
        Ended("i2", 1, "q", within.message.replace("high", "run-9"), NOW - 10),  # no run run-9 waits in q
        Ended("i3", 1, "p", within.message.replace("high", "run-9"), NOW - HOLD_FOR),  # too long ago
    ]
    assert holds_for(ended, queue, NOW) == (
        Hold("i0", "r9", 1, NOW - 10 + HOLD_FOR),
        Hold("i1", "r8", 2, NOW - 10 + HOLD_FOR),
    )


@hsettings(max_examples=60, deadline=None)
@given(
    busy=st.lists(st.integers(0, 2), min_size=3, max_size=3),
    held=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 2), st.integers(0, 3)), max_size=3),
    others=st.lists(st.tuples(st.integers(1, 2), st.integers(0, 90)), min_size=1, max_size=5),
    expired=st.booleans(),
)
def test_no_other_run_takes_held_blocks_and_expired_holds_change_nothing(
    busy: list[int], held: list[tuple[int, int, int]], others: list[tuple[int, int]], expired: bool
) -> None:
    jobs = [running(10 * h + k, h) for h, n in enumerate(busy) for k in range(n)]
    holders = [waiting(100 + r, 0, gpus=4, project="q", at=900.0)[0] for r in range(4)]  # never fit: always wait
    queue = [q for n, (g, p) in enumerate(others) for q in waiting(n, p, gpus=g, at=float(n))]
    until = NOW - 1 if expired else NOW + 60
    holds = tuple(Hold(f"i{h}", f"r{100 + r}", b, until) for h, b, r in held)
    snap = replace(cluster(3, jobs), queue=(*queue, *holders), holds=holds)
    plan = schedule(snap, NOW)
    if expired:
        assert plan == schedule(replace(snap, holds=()), NOW)
        return
    taken: dict[str, int] = {}
    for d in (d for g in plan.gangs for d in g.decisions):
        if isinstance(d, Assign):
            taken[d.instance_id] = taken.get(d.instance_id, 0) + d.blocks
    for h in range(3):
        reserved = sum(b for i, b, _ in held if i == h)
        assert taken.get(f"i{h}", 0) <= max(0, 2 - busy[h] - reserved), (h, taken, held)


def test_a_waiting_run_without_a_project_name_is_found_by_its_project_only() -> None:
    queued = (job(9),)  # run-9 of project id "p", its project's name not known
    within = Preemption("v", "low", ("j",), "r9", "run-9", WITHIN_PROJECT, "p").message
    reclaim = Preemption("v", "low", ("j",), "r9", "run-9", RECLAIM, "p").message
    ended = [Ended("i0", 1, "p", within, NOW - 10), Ended("i1", 1, "q", reclaim, NOW - 10)]
    assert holds_for(ended, queued, NOW) == (Hold("i0", "r9", 1, NOW - 10 + HOLD_FOR),)


def test_a_preemptor_already_told_its_wait_keeps_its_hold_without_a_new_decision() -> None:
    # i0: one block busy, the other held for r9, which needs both and so waits
    snap = cluster(1, [running(0, 0, priority=60)])
    queue = (*waiting(5, 0, at=10.0), *waiting(9, 90, gpus=2, at=500.0))
    snap = replace(snap, queue=queue, holds=(Hold("i0", "r9", 1, NOW + 60),))
    waits = {d.job_id: d.message for g in schedule(snap, NOW).gangs for d in g.decisions if isinstance(d, (Wait, Fail))}
    assert waits["j9-0"].startswith("Waiting for capacity")
    told = replace(snap, queue=(queue[0], replace(queue[1], status_message=waits["j9-0"])))
    assert [g.run_id for g in schedule(told, NOW).gangs] == ["r5"] and assigned(told) == {}


def test_a_hold_on_blocks_still_busy_takes_nothing_from_other_runs() -> None:
    snap = cluster(1, [running(0, 0), running(1, 0)])  # i0 full: its victim has not ended yet
    snap = replace(
        snap, queue=(*waiting(5, 0, at=10.0), *waiting(9, 90, at=500.0)), holds=(Hold("i0", "r9", 1, NOW + 60),)
    )
    assert assigned(snap) == {}
    freed = replace(snap, fleets=cluster(1, [running(0, 0)]).fleets)  # one block free: r9's, held for it
    assert assigned(freed) == {"r9": "i0"}
