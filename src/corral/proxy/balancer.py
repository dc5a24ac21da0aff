"""Which ready replica takes the next request: the one with the fewest requests in flight, ties broken by
rotation; a replica whose connections keep failing (``failure_threshold`` in a row) is passed over for
``eject_for`` seconds (the probes take it out of the route meanwhile, or it comes back)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol, TypeVar


class _HasJobId(Protocol):
    @property
    def job_id(self) -> str: ...


R = TypeVar("R", bound=_HasJobId)


class Balancer:
    def __init__(self, failure_threshold: int = 3, eject_for: float = 5.0) -> None:
        self.failure_threshold = failure_threshold
        self.eject_for = eject_for
        self.in_flight: dict[str, int] = {}
        self._turn: dict[str, int] = {}
        self._failures: dict[str, int] = {}
        self._ejected_until: dict[str, float] = {}

    def pick(self, service: str, replicas: Sequence[R], now: float, exclude: Collection[str] = ()) -> R | None:
        candidates = [r for r in replicas if r.job_id not in exclude]
        healthy = [r for r in candidates if self._ejected_until.get(r.job_id, 0.0) <= now]
        pool = healthy or candidates  # every replica failing: try them all the same
        if not pool:
            return None
        low = min(self.in_flight.get(r.job_id, 0) for r in pool)
        tied = [r for r in pool if self.in_flight.get(r.job_id, 0) == low]
        turn = self._turn.get(service, 0)
        self._turn[service] = turn + 1
        return tied[turn % len(tied)]

    def started(self, job_id: str) -> None:
        self.in_flight[job_id] = self.in_flight.get(job_id, 0) + 1

    def finished(self, job_id: str) -> None:
        left = self.in_flight.get(job_id, 0) - 1
        if left > 0:
            self.in_flight[job_id] = left
        else:
            self.in_flight.pop(job_id, None)

    def connect_failed(self, job_id: str, now: float) -> None:
        count = self._failures.get(job_id, 0) + 1
        self._failures[job_id] = count
        if count >= self.failure_threshold:
            self._ejected_until[job_id] = now + self.eject_for

    def connected(self, job_id: str) -> None:
        if self._failures.pop(job_id, None) is not None:
            self._ejected_until.pop(job_id, None)

    def forget_one(self, job_id: str) -> None:
        self._failures.pop(job_id, None)
        self._ejected_until.pop(job_id, None)

    def forget(self, live: Collection[str]) -> None:
        """Drop what is kept of replicas no longer routed to."""
        for d in (self._failures, self._ejected_until):
            for job_id in [j for j in d if j not in live]:
                del d[job_id]
