"""nginx's limit_req, step by step (nginx source, ngx_http_limit_req_module.c: excess in thousandths, 1 ms steps)."""

from __future__ import annotations

from corral.gateway.core.model import RateLimit
from corral.gateway.core.ratelimit import Buckets, Rule, pick, rule_of

KEY = ("p", "r", "/", "10.0.0.1")


def test_rule_rounds_to_requests_per_minute_as_dstack_renders_it() -> None:
    assert rule_of(RateLimit("/", None, 2.0, 0)) == Rule("/", None, 2000, 0)  # 120 r/m
    assert rule_of(RateLimit("/", "X-K", 1 / 60, 3)) == Rule("/", "X-K", 16, 3000)  # 1 r/m, burst 3
    assert rule_of(RateLimit("/", None, 0.001, 0)).rate == 16  # never below 1 r/m


def test_rps_2_means_one_request_per_500_ms() -> None:
    b, rule = Buckets(), rule_of(RateLimit("/", None, 2, 0))
    assert b.allow(KEY, rule, 0)
    assert not b.allow(KEY, rule, 499)
    assert b.allow(KEY, rule, 500)
    assert not b.allow(KEY, rule, 500)
    assert len(b) == 1


def test_burst_serves_at_once_then_refuses() -> None:
    b, rule = Buckets(), rule_of(RateLimit("/", None, 1, 2))
    assert [b.allow(KEY, rule, 0) for _ in range(4)] == [True, True, True, False]
    assert b.allow(KEY, rule, 1000)  # one drained
    assert not b.allow(KEY, rule, 1000)


def test_the_clock_going_back() -> None:
    b, rule = Buckets(), rule_of(RateLimit("/", None, 1, 1))
    assert b.allow(KEY, rule, 100_000)
    assert b.allow(KEY, rule, 99_000)  # a little back: 0 ms elapsed, burst 1 takes it
    assert not b.allow(KEY, rule, 99_000)
    b2 = Buckets()
    assert b2.allow(KEY, rule, 100_000)
    assert b2.allow(KEY, rule, 1_000)  # far back (over 60 s): counted as 1 ms
    assert not b2.allow(KEY, rule, 1_000)


def test_prune_drops_drained_keys_only() -> None:
    b, rule = Buckets(), rule_of(RateLimit("/", None, 1, 5))
    b.allow(("a",), rule, 0)
    b.allow(("b",), rule, 0)
    b.allow(("b",), rule, 0)  # excess 1000
    assert b.prune(500) == 1  # a: excess 0; b: 1000 - 500 > 0
    assert b.prune(2000) == 0
    assert b.prune(-5) == 0


def test_longest_prefix_wins() -> None:
    limits = (RateLimit("/", None, 1, 0), RateLimit("/v1/chat", None, 2, 0), RateLimit("/v1", None, 3, 0))
    assert pick(limits, "/v1/chat/completions") == limits[1]
    assert pick(limits, "/v1/models") == limits[2]
    assert pick(limits, "/health") == limits[0]
    assert pick(limits[1:], "/health") is None
    assert pick((), "/") is None
