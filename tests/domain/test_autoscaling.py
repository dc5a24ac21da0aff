"""dstack's scalers (``domain.autoscaling``): random inputs against a direct reading of 0.22.5's
``RPSAutoscaler.get_desired_count`` and ``ManualScaler``, and the cases that matter by name."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.domain.autoscaling import Scaling, desired_count


def _dstack(current: int, low: int, high: int, s: Scaling, requests: int | None, last: float | None, now: float) -> int:
    if not requests and requests != 0:
        return current
    rps = requests / s.window
    new = min(max(math.ceil(rps / s.target), low), high)
    if new > current:
        if current == 0:
            return new
        if last is not None and now - last < s.scale_up_delay:
            return current
        return new
    if new < current:
        if last is not None and now - last < s.scale_down_delay:
            return current
        return new
    return new


@settings(max_examples=500, deadline=None)
@given(
    current=st.integers(0, 10),
    low=st.integers(0, 5),
    span=st.integers(0, 5),
    target=st.floats(0.01, 50),
    window=st.sampled_from([30, 60, 300]),
    requests=st.none() | st.integers(0, 100_000),
    last=st.none() | st.floats(0, 1000),
    now=st.floats(0, 2000),
    up=st.integers(0, 600),
    down=st.integers(0, 600),
)
def test_matches_dstacks_rps_autoscaler(
    current: int, low: int, span: int, target: float, window: int, requests: int | None,
    last: float | None, now: float, up: int, down: int,
) -> None:  # fmt: skip
    s = Scaling(target, window, up, down)
    assert desired_count(current, low, low + span, s, requests, last, now) == _dstack(
        current, low, low + span, s, requests, last, now
    )


def test_the_cases_by_name() -> None:
    s = Scaling(target=1.0, window=60, scale_up_delay=300, scale_down_delay=600)
    assert desired_count(0, 0, 4, s, 1, 0.0, 1.0) == 1  # from zero: at once, whatever the delay
    assert desired_count(1, 0, 4, s, 600, 0.0, 100.0) == 1  # 10 rps but scaled 100 s ago: waits
    assert desired_count(1, 0, 4, s, 600, 0.0, 300.0) == 4  # ... clipped to max
    assert desired_count(2, 0, 4, s, 0, 0.0, 599.0) == 2 and desired_count(2, 0, 4, s, 0, 0.0, 600.0) == 0
    assert desired_count(3, 0, 4, s, None, None, 0.0) == 3  # no stats: stays
    assert desired_count(7, 1, 4, None, None, None, 0.0) == 4  # no scaling: clipped (ManualScaler)


def test_steady_traffic_keeps_the_count_and_a_drop_scales_down_after_the_delay() -> None:
    s = Scaling(target=1.0, window=60.0, scale_up_delay=0.0, scale_down_delay=600.0)
    assert desired_count(2, 0, 4, s, 120, 0.0, 10.0) == 2  # 2 rps at a target of 1: as many as now
    assert desired_count(3, 0, 4, s, 60, 0.0, 100.0) == 3  # 1 rps, but scaled 100 s ago: stays
    assert desired_count(3, 0, 4, s, 60, 0.0, 700.0) == 1
    assert desired_count(3, 0, 4, s, 60, None, 700.0) == 1  # never scaled: at once
