"""Job metrics as values: a stored sample (:class:`MetricsPoint`), dstack's series built from samples
(``metrics/job``), and the retention rule.

``job_series`` is dstack 0.22.5's ``services/metrics.py`` computation: from ``limit + 1`` samples, newest
first, each series has one value per sample but the oldest (CPU needs the previous one):
``cpu_usage_percent`` = Δ CPU time / Δ wall time × 100 (an integer; above 100 on several cores),
``memory_usage_bytes``, ``memory_working_set_bytes``, the constants ``cpus_detected_num``,
``memory_total_bytes``, ``gpus_detected_num``, ``gpu_memory_total_bytes`` (from the job's offer), and per GPU
``gpu_memory_usage_bytes_gpu{i}``, ``gpu_util_percent_gpu{i}``. Fewer than two samples give no series; a GPU
count that changes within the window drops every GPU series. Pure: no SQL, HTTP, asyncio or clocks.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.domain.statuses import HOLDING_JOB

#: dstack's defaults: ``DSTACK_SERVER_METRICS_RUNNING_TTL_SECONDS`` (1 h) and ``..._FINISHED_TTL_SECONDS`` (7 d).
DEFAULT_RUNNING_TTL = 3600.0
DEFAULT_FINISHED_TTL = 7 * 24 * 3600.0
#: Job statuses whose samples follow the running TTL (the rest: the finished one).
LIVE_STATUSES = HOLDING_JOB


@dataclass(frozen=True)
class MetricsPoint:
    """One sample of a job: CPU time is cumulative (µs); the GPUs in the order of the job's devices."""

    timestamp_micro: int
    cpu_usage_micro: int
    memory_usage_bytes: int
    memory_working_set_bytes: int
    gpus_memory_usage_bytes: tuple[int, ...] = field(default_factory=tuple)
    gpus_util_percent: tuple[int, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class JobResources:
    """What the job's offer says it has (None where unknown): the series' constants."""

    cpus: int | None = None
    memory_bytes: int | None = None
    gpu_memory_bytes: int | None = None


@dataclass(frozen=True)
class Series:
    name: str
    timestamps_micro: tuple[int, ...]
    values: tuple[Any, ...]


def cpu_percent(point: MetricsPoint, previous: MetricsPoint) -> int:
    window = point.timestamp_micro - previous.timestamp_micro
    if window <= 0:
        return 0
    return max(0, round((point.cpu_usage_micro - previous.cpu_usage_micro) / window * 100))


def job_series(points: Sequence[MetricsPoint], resources: JobResources) -> list[Series]:
    """dstack's series from samples ordered newest first (see the module's docstring)."""
    if len(points) < 2:
        return []
    pairs = list(itertools.pairwise(points))
    stamps = tuple(p.timestamp_micro for p, _ in pairs)
    out = [
        Series("cpu_usage_percent", stamps, tuple(cpu_percent(p, q) for p, q in pairs)),
        Series("memory_usage_bytes", stamps, tuple(p.memory_usage_bytes for p, _ in pairs)),
        Series("memory_working_set_bytes", stamps, tuple(p.memory_working_set_bytes for p, _ in pairs)),
    ]

    def constant(name: str, value: Any) -> Series:
        return Series(name, stamps, tuple(value for _ in stamps))

    if resources.cpus is not None:
        out.append(constant("cpus_detected_num", resources.cpus))
    if resources.memory_bytes is not None:
        out.append(constant("memory_total_bytes", resources.memory_bytes))
    counts = {len(p.gpus_memory_usage_bytes) for p, _ in pairs} | {len(p.gpus_util_percent) for p, _ in pairs}
    if len(counts) != 1:
        return out  # the GPU count changed within the window: GPUs are numbered by position only
    gpus = counts.pop()
    out.append(constant("gpus_detected_num", gpus))
    if resources.gpu_memory_bytes is not None and gpus:
        out.append(constant("gpu_memory_total_bytes", resources.gpu_memory_bytes))
    for i in range(gpus):
        out.append(
            Series(f"gpu_memory_usage_bytes_gpu{i}", stamps, tuple(p.gpus_memory_usage_bytes[i] for p, _ in pairs))
        )
    for i in range(gpus):
        out.append(Series(f"gpu_util_percent_gpu{i}", stamps, tuple(p.gpus_util_percent[i] for p, _ in pairs)))
    return out


def retention_cutoffs(now: float, running_ttl: float, finished_ttl: float) -> tuple[int, int]:
    """The timestamps (µs) before which a live job's and a finished job's samples go."""
    return int((now - running_ttl) * 1_000_000), int((now - finished_ttl) * 1_000_000)
