"""``domain.utilization``: dstack 0.22.5's utilization-policy rule, against a direct reading of it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from corral.domain.utilization import low_utilization, message

NOW = 10_000.0
WINDOW = 600.0

samples = st.lists(
    st.tuples(st.floats(NOW - 2 * WINDOW, NOW), st.lists(st.integers(0, 100), min_size=1, max_size=3)),
    max_size=30,
)


def reference(min_util: int, window: float, now: float, got: list[tuple[float, list[int]]]) -> bool:
    inside = sorted((s for s in got if s[0] >= now - window), key=lambda s: -s[0])  # newest first, as dstack
    if not inside or inside[-1][0] > now - window + 60:
        return False
    per_gpu: dict[int, list[int]] = {}
    for _, utils in inside:
        for i, u in enumerate(utils):
            per_gpu.setdefault(i, []).append(u)
    return any(all(u < min_util for u in values) for values in per_gpu.values())


@given(st.integers(0, 100), samples)
def test_matches_the_rule(min_util: int, got: list[tuple[float, list[int]]]) -> None:
    assert low_utilization(min_util, WINDOW, NOW, got) == reference(min_util, WINDOW, NOW, got)


@given(st.integers(1, 100), st.integers(0, 20))
def test_an_idle_gpu_over_a_covered_window_is_terminated(min_util: int, extra: int) -> None:
    idle = [(NOW - WINDOW + 30 + i * 10.0, [min_util - 1, 100]) for i in range(extra + 1)]
    assert low_utilization(min_util, WINDOW, NOW, idle)  # one GPU idle is enough, as in dstack
    busy = [(ts, [min_util, 100]) for ts, _ in idle]
    assert not low_utilization(min_util, WINDOW, NOW, busy)
    young = [s for s in idle if s[0] > NOW - WINDOW + 90]  # the window is not covered yet
    assert not low_utilization(min_util, WINDOW, NOW, young)


def test_message_is_dstacks() -> None:
    assert message(10, 300.0) == "The job GPU utilization below 10% for 300 seconds"


def test_one_gpu_idle_through_a_covered_window_terminates_the_job() -> None:
    samples = [(float(t), [90, 5]) for t in range(0, 601, 60)]
    assert low_utilization(10, 600.0, 600.0, samples)
    assert not low_utilization(3, 600.0, 600.0, samples)
    # a sample that reached the limit somewhere in the window keeps the GPU
    assert not low_utilization(10, 600.0, 600.0, [*samples[:-1], (600.0, [90, 50])])


def test_a_window_without_enough_samples_is_not_judged() -> None:
    assert not low_utilization(10, 600.0, 600.0, [])
    late = [(float(t), [0]) for t in range(120, 601, 60)]  # the oldest 120 s after the window's start
    assert not low_utilization(10, 600.0, 600.0, late)
    assert not low_utilization(10, 600.0, 700.0, [(0.0, [0]), (50.0, [0])])  # all older than the window


def test_samples_with_fewer_gpus_count_for_the_gpus_they_have() -> None:
    samples = [(0.0, [0]), (300.0, [0, 80]), (600.0, [0, 2])]
    assert low_utilization(10, 600.0, 600.0, samples)  # GPU 0 idle throughout
    assert message(10, 600.0) == "The job GPU utilization below 10% for 600 seconds"


def test_a_short_window_must_be_covered_for_most_of_it() -> None:
    """A 30 s window (``CORRAL_UTILIZATION_MIN_WINDOW``, for checks): samples of its last 10 s do not cover it
    (dstack's minute of slack would), samples from 25 s before do (a fifth of it: 6 s)."""
    assert not low_utilization(50, 30.0, 100.0, [(float(t), [0]) for t in range(90, 101)])
    assert low_utilization(50, 30.0, 100.0, [(float(t), [0]) for t in range(75, 101)])
