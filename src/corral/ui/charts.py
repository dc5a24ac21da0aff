"""A job's metrics as small line charts for its run's page: the series ``metrics/job`` answers (read through
``services.metrics.job_metrics``, the last hour at most) drawn as SVG polylines on the server -- CPU %, memory
(working set, against the job's memory), and each GPU's utilisation and memory. No script draws them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from corral.domain.records import ProjectRec
from corral.schemas.requests import JobMetricsQuery
from corral.services import metrics
from corral.services.errors import ResourceNotExists

WIDTH, HEIGHT = 300.0, 60.0
SAMPLES = 360  # an hour of samples at the agent's 10 s


@dataclass(frozen=True)
class Chart:
    title: str
    latest: str
    points: str  # the polyline's "x,y x,y ..." in a WIDTH x HEIGHT box
    label: str  # what a screen reader says of it


def _polyline(values: list[float], top: float) -> str:
    top = top if top > 0 else max(values, default=1.0) or 1.0
    n = len(values)
    step = WIDTH / (n - 1) if n > 1 else WIDTH
    return " ".join(f"{i * step:.1f},{HEIGHT - min(v / top, 1.0) * (HEIGHT - 2) - 1:.1f}" for i, v in enumerate(values))


def _gb(v: float) -> str:
    return f"{v / 1e9:.1f} GB"


def charts_of(answer: dict[str, Any]) -> list[Chart]:
    """The charts of a ``metrics/job`` answer (its series newest first: drawn oldest first)."""
    series = {s["name"]: list(reversed(s["values"])) for s in answer["metrics"]}
    if not series:
        return []
    out = []
    cpus = (series.get("cpus_detected_num") or [0])[-1] or 1
    cpu = [float(v) / cpus for v in series.get("cpu_usage_percent", [])]
    if cpu:
        out.append(
            Chart("CPU", f"{cpu[-1]:.0f}%", _polyline(cpu, 100.0), f"CPU use, now {cpu[-1]:.0f}% of {cpus} CPUs")
        )
    mem = [float(v) for v in series.get("memory_working_set_bytes", [])]
    if mem:
        total = float((series.get("memory_total_bytes") or [0])[-1])
        of = f" of {_gb(total)}" if total else ""
        out.append(Chart("Memory", _gb(mem[-1]) + of, _polyline(mem, total), f"Memory use, now {_gb(mem[-1])}{of}"))
    gpus = int((series.get("gpus_detected_num") or [0])[-1])
    gpu_total = float((series.get("gpu_memory_total_bytes") or [0])[-1])
    for i in range(gpus):
        util = [float(v) for v in series.get(f"gpu_util_percent_gpu{i}", [])]
        if util:
            out.append(
                Chart(f"GPU {i}", f"{util[-1]:.0f}%", _polyline(util, 100.0), f"GPU {i} use, now {util[-1]:.0f}%")
            )
        used = [float(v) for v in series.get(f"gpu_memory_usage_bytes_gpu{i}", [])]
        if used:
            out.append(
                Chart(
                    f"GPU {i} memory", _gb(used[-1]), _polyline(used, gpu_total), f"GPU {i} memory, now {_gb(used[-1])}"
                )
            )
    return out


async def job_charts(ctx: Any, project: ProjectRec, run: dict[str, Any], job: dict[str, Any] | None) -> list[Chart]:
    if job is None:
        return []
    try:
        q = JobMetricsQuery.model_validate(
            {"run_id": run["id"], "replica_num": job["replica_num"], "job_num": job["job_num"], "limit": SAMPLES}
        )
    except ValidationError:
        return []
    try:
        answer = await metrics.job_metrics(ctx, project, run["run_spec"]["run_name"], q)
    except ResourceNotExists:
        return []
    return charts_of(answer)
