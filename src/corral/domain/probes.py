"""Readiness of service replicas from their probes (pure).

dstack latches a replica ``ready`` once every probe reached ``ready_after`` successes in a row, and never
takes it back. corral gates traffic continuously: a replica enters when every probe has ``ready_after``
successes in a row, leaves when any probe has ``failure_threshold`` failures in a row, and comes back when
its probes pass again. A replica without probes is probed by connecting to its port (``ready_after`` 1).
A probe with ``until_ready`` stops once the replica is ready (as in dstack).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: The implicit probe of a replica whose spec has none: its port accepts a connection.
PORT_PROBE: dict[str, Any] = {"type": "tcp", "ready_after": 1, "interval": 1, "timeout": 2, "until_ready": False}


@dataclass(frozen=True)
class Streak:
    success: int = 0
    failure: int = 0

    def after(self, ok: bool) -> Streak:
        return Streak(self.success + 1, 0) if ok else Streak(0, self.failure + 1)

    def to_json(self) -> dict[str, int]:
        return {"success_streak": self.success, "failure_streak": self.failure}

    @staticmethod
    def from_json(data: Any) -> Streak:
        if not isinstance(data, dict):
            return Streak()
        return Streak(int(data.get("success_streak") or 0), int(data.get("failure_streak") or 0))


def effective_probes(specs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The probes a replica is checked with: its spec's, or the port probe."""
    return list(specs) if specs else [PORT_PROBE]


def readiness(ready: bool, specs: Sequence[dict[str, Any]], streaks: Sequence[Streak], failure_threshold: int) -> bool:
    """Whether the replica is ready after its probes' latest results (``specs`` as ``effective_probes``)."""
    if len(streaks) != len(specs) or not specs:
        return ready
    if any(s.failure >= failure_threshold for s, p in zip(streaks, specs, strict=True) if not _stopped(p, ready)):
        return False
    if all(s.success >= int(p.get("ready_after") or 1) for s, p in zip(streaks, specs, strict=True)):
        return True
    return ready


def _stopped(spec: dict[str, Any], ready: bool) -> bool:
    return bool(spec.get("until_ready")) and ready


def due(spec: dict[str, Any], ready: bool, last: float | None, now: float) -> bool:
    """Whether a probe is due now (``last``: when it last ran; an ``until_ready`` probe of a ready replica
    runs no more)."""
    if _stopped(spec, ready):
        return False
    return last is None or now - last >= float(spec.get("interval") or 15)
