"""A replica group's desired replica count (pure): dstack 0.22.5's scalers (``ManualScaler``,
``RPSAutoscaler`` of ``server/services/services/autoscalers.py``) with ``now`` a parameter.

Without ``scaling`` the count is the current one clipped to ``[min, max]``. With ``scaling`` (``metric:
rps``): ``rps = requests in the window / window``, ``desired = ceil(rps / target)`` clipped to ``[min,
max]``; from zero replicas a scale-up is immediate, otherwise a scale-up waits ``scale_up_delay`` and a
scale-down ``scale_down_delay`` since the group was last scaled; with no stats the count stays.

Imports nothing of corral.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: dstack's ``DEFAULT_SCALING_WINDOW``.
DEFAULT_WINDOW = 60


@dataclass(frozen=True)
class Scaling:
    target: float
    window: float = DEFAULT_WINDOW
    scale_up_delay: float = 300.0
    scale_down_delay: float = 600.0


def desired_count(
    current: int,
    low: int,
    high: int,
    scaling: Scaling | None,
    requests_in_window: int | None,
    last_scaled_at: float | None,
    now: float,
) -> int:
    """The group's next desired count (``requests_in_window``: None when no stats exist)."""
    if scaling is None:
        return min(max(current, low), high)
    if requests_in_window is None:
        return current
    rps = requests_in_window / scaling.window
    new = min(max(math.ceil(rps / scaling.target), low), high)
    since = None if last_scaled_at is None else now - last_scaled_at
    if new > current:
        if current == 0:
            return new
        if since is not None and since < scaling.scale_up_delay:
            return current
        return new
    if new < current:
        if since is not None and since < scaling.scale_down_delay:
            return current
        return new
    return new
