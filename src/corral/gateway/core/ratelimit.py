"""Rate limits as nginx's ``limit_req`` applies them (dstack 0.22.5 renders each service's ``rate_limits`` as one
``limit_req_zone ... rate=<round(rps*60)>r/m`` and ``limit_req zone=... burst=N nodelay`` per prefix location).

The algorithm is nginx's ``ngx_http_limit_req_lookup`` (nginx source, ``src/http/modules/ngx_http_limit_req_module.c``):
per key an ``excess`` in thousandths of a request and the time of the last accepted request, in milliseconds;
a request adds 1000 and the time since drains ``rate`` per second; past ``burst * 1000`` it is refused (and changes
nothing), else accepted at once (``nodelay``). Requests with an empty key are not limited (nginx's documentation of
``limit_req_zone``). The longest matching prefix picks the limit, as nginx's prefix locations do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from .model import RateLimit


@dataclass(frozen=True)
class Rule:
    prefix: str
    header: Optional[str]
    rate: int  # thousandths of a request per second, as nginx keeps it
    burst: int  # thousandths of a request


def rule_of(limit: RateLimit) -> Rule:
    per_minute = max(1, round(limit.rps * 60))  # dstack's rate=<round(rps*60)>r/m
    return Rule(limit.prefix, limit.header, per_minute * 1000 // 60, limit.burst * 1000)


def pick(limits: Sequence[RateLimit], path: str) -> Optional[RateLimit]:
    """The limit whose prefix is the longest one ``path`` starts with (None: no limit applies)."""
    best: Optional[RateLimit] = None
    for limit in limits:
        if path.startswith(limit.prefix) and (best is None or len(limit.prefix) > len(best.prefix)):
            best = limit
    return best


class Buckets:
    """Every key's ``[excess, last_ms, rate]``; keys whose excess has drained are dropped by :meth:`prune`."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, ...], list[int]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def allow(self, key: tuple[str, ...], rule: Rule, now_ms: int) -> bool:
        entry = self._entries.get(key)
        if entry is None:
            self._entries[key] = [0, now_ms, rule.rate]
            return True
        ms = now_ms - entry[1]
        if ms < -60000:  # the clock went back a lot: as nginx, count it as 1 ms
            ms = 1
        elif ms < 0:
            ms = 0
        excess = max(0, entry[0] - rule.rate * ms // 1000 + 1000)
        if excess > rule.burst:
            return False
        entry[0], entry[2] = excess, rule.rate
        if ms:
            entry[1] = now_ms
        return True

    def prune(self, now_ms: int) -> int:
        """Drop the keys that would start from nothing again; returns how many are kept."""
        self._entries = {k: e for k, e in self._entries.items() if e[0] - e[2] * max(0, now_ms - e[1]) // 1000 > 0}
        return len(self._entries)
