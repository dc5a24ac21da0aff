"""The wire format of a job's resource samples (dstack's runner ``GET /api/metrics`` shape).

A sample is ``{"timestamp_micro", "cpu_usage_micro", "memory_usage_bytes", "memory_working_set_bytes",
"gpus": [{"gpu_memory_usage_bytes", "gpu_util_percent"}]}``: the CPU time is cumulative (the server takes
the difference of two samples), the rest are values at that instant, the GPUs in the order of the job's
devices. Samples ride on ``GET /jobs/{id}/logs?metrics_after=T`` (those taken after ``T``, oldest first),
so following a job's output also brings its samples, in batches. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: The most samples one logs reply carries (the rest come with the next poll).
MAX_SAMPLES_PER_REPLY = 200
#: The most GPUs one sample may name.
MAX_GPUS = 64
_MAX_INT = 2**62


class SampleError(ValueError):
    """A sample that cannot be stored (its message names the field)."""


def _count(d: dict[str, Any], name: str, where: str) -> int:
    v = d.get(name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        raise SampleError(f"{where}.{name}: expected a number, got {v!r}"[:200])
    if not 0 <= v < _MAX_INT:
        raise SampleError(f"{where}.{name}: {v!r} is out of range (0..2^62)"[:200])
    return int(v)


@dataclass(frozen=True)
class GpuSample:
    gpu_memory_usage_bytes: int
    gpu_util_percent: int

    def to_dict(self) -> dict[str, Any]:
        return {"gpu_memory_usage_bytes": self.gpu_memory_usage_bytes, "gpu_util_percent": self.gpu_util_percent}


@dataclass(frozen=True)
class MetricsSample:
    timestamp_micro: int
    cpu_usage_micro: int
    memory_usage_bytes: int
    memory_working_set_bytes: int
    gpus: tuple[GpuSample, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "timestamp_micro": self.timestamp_micro,
            "cpu_usage_micro": self.cpu_usage_micro,
            "memory_usage_bytes": self.memory_usage_bytes,
            "memory_working_set_bytes": self.memory_working_set_bytes,
            "gpus": [g.to_dict() for g in self.gpus],
        }

    @classmethod
    def from_dict(cls, data: Any) -> MetricsSample:
        w = "metrics[]"
        if not isinstance(data, dict):
            raise SampleError(f"{w}: expected an object")
        gpus = data.get("gpus", [])
        if not isinstance(gpus, list) or len(gpus) > MAX_GPUS:
            raise SampleError(f"{w}.gpus: expected a list of at most {MAX_GPUS} objects")
        parsed = []
        for g in gpus:
            if not isinstance(g, dict):
                raise SampleError(f"{w}.gpus[]: expected an object")
            util = _count(g, "gpu_util_percent", w + ".gpus[]")
            parsed.append(GpuSample(_count(g, "gpu_memory_usage_bytes", w + ".gpus[]"), min(util, 100)))
        return cls(
            timestamp_micro=_count(data, "timestamp_micro", w),
            cpu_usage_micro=_count(data, "cpu_usage_micro", w),
            memory_usage_bytes=_count(data, "memory_usage_bytes", w),
            memory_working_set_bytes=_count(data, "memory_working_set_bytes", w),
            gpus=tuple(parsed),
        )


def parse_samples(data: Any) -> tuple[list[MetricsSample], list[str]]:
    """The valid samples of a reply's ``metrics`` (absent: none), and why each other one was dropped: a bad
    sample from an agent is logged and skipped, never a reason to fail the job it describes."""
    if data is None:
        return [], []
    if not isinstance(data, list):
        return [], ["metrics: expected a list"]
    good: list[MetricsSample] = []
    bad: list[str] = []
    for item in data[:MAX_SAMPLES_PER_REPLY]:
        try:
            good.append(MetricsSample.from_dict(item))
        except SampleError as e:
            bad.append(str(e))
    return good, bad
