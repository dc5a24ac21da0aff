"""Per-service request stats as dstack's gateway keeps them for the autoscaler: 1-second frames of requests and
their total time, summed over windows of 30, 60 and 300 s (dstack 0.22.5's gateway app, ``proxy/gateway/``,
``GET /api/stats/collect``: ``{requests, request_time}`` per window, ``request_time`` the mean in seconds, zeros
for a service without traffic).
"""

from __future__ import annotations

from collections import deque

WINDOWS = (30, 60, 300)


class ServiceStats:
    def __init__(self) -> None:
        self._frames: deque[list[float]] = deque()  # [second, requests, total seconds], oldest first

    def record(self, now: float, duration: float) -> None:
        second = int(now)
        if self._frames and self._frames[-1][0] == second:
            frame = self._frames[-1]
            frame[1] += 1
            frame[2] += duration
        else:
            self._frames.append([second, 1, duration])
        self._drop_old(second)

    def _drop_old(self, second: int) -> None:
        while self._frames and self._frames[0][0] <= second - WINDOWS[-1]:
            self._frames.popleft()

    def summary(self, now: float) -> dict[str, dict[str, float]]:
        second = int(now)
        self._drop_old(second)
        out: dict[str, dict[str, float]] = {}
        for window in WINDOWS:
            frames = [f for f in self._frames if f[0] > second - window]
            requests = int(sum(f[1] for f in frames))
            total = sum(f[2] for f in frames)
            out[str(window)] = {"requests": requests, "request_time": total / requests if requests else 0.0}
        return out
