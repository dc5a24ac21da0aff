"""A run's ``utilization_policy``, as dstack 0.22.5 applies it (``_check_gpu_utilization``): a running job
is terminated once any one of its GPUs stayed below ``min_gpu_utilization`` percent in every sample of the
last ``time_window`` seconds -- judged only when the samples cover that window (the oldest one within a
minute of its start; within a fifth of it for a window under 5 minutes, which only the checks' setting
``CORRAL_UTILIZATION_MIN_WINDOW`` allows), so a job that just started, or whose samples are missing, is left
alone.

Pure: the samples and ``now`` are parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

#: The oldest sample must be at most this long after the window's start for the window to count as covered
#: (dstack's minute; a fifth of a shorter window than five minutes).
COVERAGE_SLACK_S = 60.0
REASON = "terminated_due_to_utilization_policy"


def low_utilization(
    min_gpu_utilization: int, time_window: float, now: float, samples: Sequence[tuple[float, Sequence[int]]]
) -> bool:
    """Whether to terminate: ``samples`` are ``(timestamp, utilization of each GPU)`` in any order (samples
    older than the window are ignored)."""
    after = now - time_window
    window = [(ts, utils) for ts, utils in samples if ts >= after]
    slack = min(COVERAGE_SLACK_S, time_window / 5)
    if not window or min(ts for ts, _ in window) > after + slack:
        return False  # not enough samples (dstack: "GPU utilization check: not enough samples")
    gpus = max(len(utils) for _, utils in window)
    for gpu in range(gpus):
        values = [utils[gpu] for _, utils in window if gpu < len(utils)]
        if values and all(v < min_gpu_utilization for v in values):
            return True
    return False


def message(min_gpu_utilization: int, time_window: float) -> str:
    """dstack's termination message."""
    return f"The job GPU utilization below {min_gpu_utilization}% for {int(time_window)} seconds"
