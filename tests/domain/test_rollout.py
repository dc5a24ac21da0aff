"""The rollout rule of a replica group (``domain.rollout``): simulated step by step over random groups,
readiness and failures, the serving version never drops below min(ready old, desired) replicas in rotation
while any old replica was ready; a rollout whose new replica never becomes ready keeps every old replica;
one that succeeds ends with every replica up to date."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.domain.rollout import DRAIN_SETTLE, GroupDecision, Phase, ReplicaView, allocate_numbers, decide_group

DRAIN = 5.0


def _apply(
    reps: dict[str, ReplicaView], d: GroupDecision, deployment: int, now: float, counter: list[int]
) -> dict[str, ReplicaView]:
    out = dict(reps)
    for job_id in d.stop:
        out.pop(job_id, None)
    for job_id in d.drain:
        r = out[job_id]
        out[job_id] = ReplicaView(r.job_id, r.replica_num, r.deployment_num, Phase.DRAINING, drain_at=now)
    for job_id in d.bump:
        r = out[job_id]
        out[job_id] = ReplicaView(r.job_id, r.replica_num, deployment, r.phase, True, r.drain_at)
    numbers = allocate_numbers(d.start, [], [r.replica_num for r in out.values()])
    for n in numbers:
        counter[0] += 1
        job_id = f"j{counter[0]}"
        out[job_id] = ReplicaView(job_id, n, deployment, Phase.STARTING, True)
    return out


def _in_rotation(reps: dict[str, ReplicaView]) -> int:
    return sum(1 for r in reps.values() if r.phase == Phase.READY)


@settings(max_examples=300, deadline=None)
@given(
    old_count=st.integers(0, 4),
    desired=st.integers(0, 4),
    seed=st.integers(0, 2**32 - 1),
    new_can_be_ready=st.booleans(),
)
def test_the_serving_version_stays_in_rotation(old_count: int, desired: int, seed: int, new_can_be_ready: bool) -> None:
    rnd = random.Random(seed)
    reps = {f"o{i}": ReplicaView(f"o{i}", i, 0, Phase.READY) for i in range(old_count)}
    counter = [0]
    now = 0.0
    for _ in range(40):
        ready_old = sum(1 for r in reps.values() if r.deployment_num == 0 and r.phase == Phase.READY)
        d = decide_group(list(reps.values()), 1, desired, now, DRAIN)
        reps = _apply(reps, d, 1, now, counter)
        if ready_old:
            assert _in_rotation(reps) >= min(ready_old, desired), (reps, d)
        # the world moves: new replicas become ready (or fail and restart), time passes
        for job_id, r in list(reps.items()):
            if r.phase == Phase.STARTING and new_can_be_ready and rnd.random() < 0.5:
                reps[job_id] = ReplicaView(r.job_id, r.replica_num, r.deployment_num, Phase.READY, True)
        now += rnd.choice([0.5, 1.0, 3.0])
    if not new_can_be_ready:  # the old version keeps serving, as many replicas as desired
        old_ready = sum(1 for r in reps.values() if r.deployment_num == 0 and r.phase == Phase.READY)
        assert old_ready == min(old_count, desired), reps
    else:
        left = [r for r in reps.values() if r.phase != Phase.DRAINING]
        assert all(r.deployment_num == 1 for r in left), left
        assert len(left) == desired


def test_a_new_replica_that_never_becomes_ready_keeps_the_old_one() -> None:
    old = ReplicaView("o", 0, 0, Phase.READY)
    d = decide_group([old], 1, 1, 0.0, DRAIN)
    assert d.start == 1 and not d.drain and not d.stop and d.rolling
    new = ReplicaView("n", 1, 1, Phase.STARTING, True)
    for t in range(100):
        d = decide_group([old, new], 1, 1, float(t), DRAIN)
        assert d == GroupDecision(rolling=True), d


def test_old_leaves_rotation_once_new_is_ready_then_is_stopped_after_the_drain() -> None:
    old = ReplicaView("o", 0, 0, Phase.READY)
    new = ReplicaView("n", 1, 1, Phase.READY, True)
    d = decide_group([old, new], 1, 1, 10.0, DRAIN)
    assert d.drain == ("o",) and d.start == 0 and d.wake_at == 10.0 + DRAIN_SETTLE
    draining = ReplicaView("o", 0, 0, Phase.DRAINING, drain_at=10.0)  # held: requests may be in flight
    assert decide_group([draining, new], 1, 1, 12.0, DRAIN).stop == ()
    assert decide_group([draining, new], 1, 1, 12.0, DRAIN).wake_at == 10.0 + DRAIN
    assert decide_group([draining, new], 1, 1, 15.0, DRAIN).stop == ("o",)


@given(
    drain_at=st.floats(0, 100),
    after=st.floats(0, 50),
    held=st.booleans(),
    timeout=st.floats(0, 30),
)
def test_a_drained_replica_stops_when_nothing_is_in_flight_never_before_the_settle(
    drain_at: float, after: float, held: bool, timeout: float
) -> None:
    """Held (a server may have requests in flight to it): stopped at the drain timeout. Released by every
    server: stopped at once, but never before ``DRAIN_SETTLE`` (nor after the timeout)."""
    draining = ReplicaView("o", 0, 0, Phase.DRAINING, drain_at=drain_at, held=held)
    new = ReplicaView("n", 1, 1, Phase.READY, True)
    now = drain_at + after
    d = decide_group([draining, new], 1, 1, now, timeout)
    due = drain_at + (timeout if held else min(timeout, DRAIN_SETTLE))
    assert (d.stop == ("o",)) == (due <= now)
    if due > now:
        assert d.wake_at == due


def test_reapplying_the_previous_configuration_ends_a_stuck_rollout() -> None:
    old = ReplicaView("o", 0, 0, Phase.READY, same_spec=True)
    stuck = ReplicaView("n", 1, 1, Phase.STARTING, same_spec=False)
    d = decide_group([old, stuck], 2, 1, 0.0, DRAIN)
    assert d.bump == ("o",) and d.stop == ("n",) and d.start == 0 and not d.drain


def test_scale_down_drains_the_least_important_and_numbers_are_reused() -> None:
    reps = [
        ReplicaView("a", 0, 0, Phase.READY),
        ReplicaView("b", 1, 0, Phase.READY),
        ReplicaView("c", 2, 0, Phase.STARTING),
    ]
    d = decide_group(reps, 0, 1, 0.0, DRAIN)
    assert d.stop == ("c",) and d.drain == ("b",)
    assert allocate_numbers(3, [2, 0], [1]) == [0, 2, 3]


def test_when_desired_drops_mid_rollout_the_newest_replicas_not_serving_yet_stop() -> None:
    old = ReplicaView("o", 0, 0, Phase.READY)
    n1 = ReplicaView("n1", 1, 1, Phase.STARTING, True)
    n2 = ReplicaView("n2", 2, 1, Phase.STARTING, True)
    d = decide_group([old, n1, n2], 1, 1, 0.0, DRAIN)
    assert d.stop == ("n2",) and d.start == 0 and not d.drain and d.rolling


def test_a_group_without_out_of_date_replicas_starts_the_missing_ones() -> None:
    current = ReplicaView("n", 0, 1, Phase.READY)
    assert decide_group([current], 1, 3, 0.0, DRAIN).start == 2
    assert decide_group([current], 1, 1, 0.0, DRAIN).start == 0


def _full_fleet_rollout(desired: int) -> list[int]:
    """A group of ``desired`` old replicas filling its fleet, rolled out step by step: a replica just started
    waits in the queue until a place is free (a drained replica's, once it is stopped), and one that was placed
    is ready at the next step. The replicas in rotation after each step."""
    reps = {f"o{i}": ReplicaView(f"o{i}", i, 0, Phase.READY) for i in range(desired)}
    counter = [0]
    serving = []
    now = 0.0
    for _ in range(6 * desired + 6):
        placed = sum(1 for r in reps.values() if not r.waiting_for_capacity)
        for job_id, r in list(reps.items()):
            if r.waiting_for_capacity and placed < desired:  # the queue: a free place is taken
                reps[job_id] = ReplicaView(job_id, r.replica_num, 1, Phase.STARTING, True)
                placed += 1
            elif r.phase == Phase.STARTING and not r.waiting_for_capacity:  # placed last step: ready now
                reps[job_id] = ReplicaView(job_id, r.replica_num, 1, Phase.READY, True)
        before = set(reps)
        reps = _apply(reps, decide_group(list(reps.values()), 1, desired, now, DRAIN), 1, now, counter)
        for job_id in set(reps) - before:  # just started: queued, no place free
            reps[job_id] = ReplicaView(
                job_id, reps[job_id].replica_num, 1, Phase.STARTING, True, waiting_for_capacity=True
            )
        serving.append(_in_rotation(reps))
        now += DRAIN + 1  # every drain ends before the next step
    assert sorted((r.deployment_num, r.phase) for r in reps.values()) == [(1, Phase.READY)] * desired, reps
    return serving


def test_a_rollout_on_a_full_fleet_replaces_one_replica_at_a_time() -> None:
    for desired in (2, 3, 4):
        serving = _full_fleet_rollout(desired)
        assert min(serving) >= desired - 1, serving
        assert serving[-1] == desired


def test_a_single_replica_with_no_room_is_never_taken_down_for_its_successor() -> None:
    old = ReplicaView("o", 0, 0, Phase.READY)
    new = ReplicaView("n", 1, 1, Phase.STARTING, True, waiting_for_capacity=True)
    for t in range(10):
        d = decide_group([old, new], 1, 1, float(t), DRAIN)
        assert d == GroupDecision(rolling=True), d


def test_on_a_full_fleet_only_one_old_replica_drains_at_a_time() -> None:
    olds = [ReplicaView(f"o{i}", i, 0, Phase.READY) for i in range(3)]
    waiting = ReplicaView("n", 3, 1, Phase.STARTING, True, waiting_for_capacity=True)
    d = decide_group([*olds, waiting], 1, 3, 0.0, DRAIN)
    assert d.drain == ("o2",), d  # (the surge may queue one more new replica: still desired + 1 at most)
    draining = ReplicaView("o2", 2, 0, Phase.DRAINING, drain_at=0.0)
    d = decide_group([olds[0], olds[1], draining, waiting], 1, 3, 0.5, DRAIN)
    assert d.drain == () and d.stop == (), d
    # the drained one is gone, the new one still waits for its place: nobody else leaves rotation
    d = decide_group([olds[0], olds[1], waiting], 1, 3, 10.0, DRAIN)
    assert d.drain == (), d
