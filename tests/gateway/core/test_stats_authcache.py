"""Stats windows (1 s frames; 30, 60, 300 s) and the auth cache's 60 s answers, with ``now`` given."""

from __future__ import annotations

from corral.gateway.core.authcache import AuthCache
from corral.gateway.core.stats import ServiceStats


def _requests(stats: ServiceStats, now: float) -> dict[str, float]:
    return {w: s["requests"] for w, s in stats.summary(now).items()}


def test_windows_count_hits_and_mean_time() -> None:
    s = ServiceStats()
    assert s.summary(1000) == {w: {"requests": 0, "request_time": 0.0} for w in ("30", "60", "300")}
    s.record(1000.1, 0.2)
    s.record(1000.9, 0.4)  # the same 1 s frame
    s.record(1050.0, 1.0)
    s.record(1200.0, 2.0)
    summary = s.summary(1200.5)
    assert summary["30"] == {"requests": 1, "request_time": 2.0}
    assert summary["300"]["requests"] == 4
    assert abs(summary["300"]["request_time"] - 3.6 / 4) < 1e-9
    assert _requests(s, 1249.0) == {"30": 0, "60": 1, "300": 4}
    assert _requests(s, 1301.0) == {"30": 0, "60": 0, "300": 2}
    assert _requests(s, 1400.0) == {"30": 0, "60": 0, "300": 1}
    assert _requests(s, 1500.0) == {"30": 0, "60": 0, "300": 0}


def test_old_frames_are_dropped_as_new_ones_come() -> None:
    s = ServiceStats()
    s.record(0, 1.0)
    s.record(300, 1.0)  # the frame of second 0 leaves the 300 s window
    assert _requests(s, 300) == {"30": 1, "60": 1, "300": 1}


def test_auth_cache_keeps_answers_60_seconds_per_project_and_token() -> None:
    c = AuthCache()
    assert c.get("p", "Bearer t", 0) is None
    c.put("p", "Bearer t", True, 0)
    c.put("p", "Bearer x", False, 0)
    assert c.get("p", "Bearer t", 59.9) is True
    assert c.get("p", "Bearer x", 59.9) is False
    assert c.get("q", "Bearer t", 1) is None
    assert c.get("p", "Bearer t", 60) is None


def test_auth_cache_is_bounded() -> None:
    c = AuthCache(ttl=10, max_entries=2)
    c.put("p", "a", True, 0)
    c.put("p", "b", True, 5)
    c.put("p", "c", True, 12)  # full: the expired "a" goes
    assert (c.get("p", "a", 12), c.get("p", "b", 12), c.get("p", "c", 12)) == (None, True, True)
    c.put("p", "d", True, 13)  # full of live answers: all forgotten, then "d"
    assert (c.get("p", "b", 13), c.get("p", "d", 13)) == (None, True)
