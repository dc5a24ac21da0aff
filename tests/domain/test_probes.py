"""Readiness from probes (pure): ``ready_after`` successes to enter, ``failure_threshold`` failures to
leave, back when passing again; ``until_ready`` probes stop once ready; the port probe without probes."""

from __future__ import annotations

from corral.domain.probes import PORT_PROBE, Streak, due, effective_probes, readiness

HTTP = {"type": "http", "url": "/health", "ready_after": 2, "interval": 5, "until_ready": False}


def _run(results: list[bool], spec: dict[str, object] = HTTP, threshold: int = 3) -> list[bool]:
    ready, streak, out = False, Streak(), []
    for ok in results:
        streak = streak.after(ok)
        ready = readiness(ready, [spec], [streak], threshold)
        out.append(ready)
    return out


def test_enter_after_ready_after_leave_after_threshold_and_come_back() -> None:
    assert _run([True, True]) == [False, True]
    # a single failure does not take a ready replica out; three in a row do; two passes bring it back
    seq = [True, True, False, True, False, False, False, True, True]
    assert _run(seq) == [False, True, True, True, True, True, False, False, True]


def test_every_probe_must_pass_to_enter_and_any_failing_takes_it_out() -> None:
    specs = [HTTP, {**HTTP, "ready_after": 1}]
    assert not readiness(False, specs, [Streak(1, 0), Streak(5, 0)], 3)
    assert readiness(False, specs, [Streak(2, 0), Streak(1, 0)], 3)
    assert not readiness(True, specs, [Streak(9, 0), Streak(0, 3)], 3)
    assert readiness(True, specs, [Streak(0, 2), Streak(4, 0)], 3)  # under the threshold: stays


def test_until_ready_probes_stop_once_ready() -> None:
    spec = {**HTTP, "until_ready": True}
    assert not due(spec, True, None, 100.0)
    assert due(spec, False, None, 100.0)
    assert readiness(True, [spec], [Streak(0, 10)], 3)  # a stopped probe no longer judges
    assert due(HTTP, True, 95.0, 100.0) and not due(HTTP, True, 96.0, 100.0)


def test_without_probes_the_port_is_probed() -> None:
    assert effective_probes([]) == [PORT_PROBE]
    assert effective_probes([HTTP]) == [HTTP]
    assert _run([True], PORT_PROBE) == [True]
    assert Streak.from_json({"success_streak": 2}) == Streak(2, 0) and Streak.from_json(None) == Streak()


def test_a_streak_is_stored_as_json_and_unreadable_json_is_a_fresh_streak() -> None:
    streak = Streak(3, 0).after(False).after(False)
    assert streak.to_json() == {"success_streak": 0, "failure_streak": 2}
    assert Streak.from_json(streak.to_json()) == streak
    assert Streak.from_json(None) == Streak() and Streak.from_json({"success_streak": None}) == Streak()


def test_readiness_stays_as_it_was_while_results_do_not_match_the_probes() -> None:
    assert readiness(True, [HTTP], [], 3) and not readiness(False, [HTTP], [], 3)
    assert readiness(True, [], [], 3)
