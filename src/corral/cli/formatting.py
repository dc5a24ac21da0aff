"""Plain-text formatting of API objects, as dstack's CLI shows them (no Rich here).

Inputs are the JSON shapes dstack 0.22.5 puts on the wire: ``ResourcesSpec``
(``{"cpu": {"arch", "count": {"min", "max"}}, "memory": {"min", "max"}, "gpu": {...},
"disk": {"size": {...}}}``, sizes in GB), instance ``Resources`` (``{cpus, memory_mib,
gpus: [{name, memory_mib, vendor}], spot, disk: {size_mib}, cpu_arch}``), runs, jobs and fleets.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

JSON = dict[str, Any]

_DURATION_UNITS = [("w", 7 * 24 * 3600), ("d", 24 * 3600), ("h", 3600), ("m", 60), ("s", 1)]
_DURATION_RE = re.compile(r"^(\d+)\s*(w|d|h|m|s|min|mins|hr|hrs|sec|secs)?$")
_UNIT_SECONDS = {"min": 60, "mins": 60, "hr": 3600, "hrs": 3600, "sec": 1, "secs": 1}

DEFAULT_IDLE_DURATION = 5 * 60
"""dstack's default idle duration of run instances (``DEFAULT_RUN_TERMINATION_IDLE_TIME``)."""


# ---- numbers, ranges, sizes ---------------------------------------------------------------


def _num(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _gb(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:g}GB"
    return str(value)


def format_range(value: Any, unit: str = "") -> str:
    """``{"min": 2, "max": null}`` -> ``2..``; ``{"min": 8, "max": 8}`` -> ``8`` (dstack's Range)."""
    fmt = _gb if unit == "GB" else _num
    if isinstance(value, dict):
        lo, hi = value.get("min"), value.get("max")
        lo_s = fmt(lo) if lo is not None else ""
        hi_s = fmt(hi) if hi is not None else ""
        return lo_s if lo_s == hi_s else f"{lo_s}..{hi_s}"
    if value is None:
        return ""
    return fmt(value)


def format_mib_as_gb(mib: int | float) -> str:
    """512 -> ``0.5GB``, 8192 -> ``8GB``."""
    return f"{round(mib / 1024, 1):g}GB"


def format_price(price: float | None, spot: bool = False) -> str:
    """``$0.1234`` with trailing zeros dropped; ``(spot)`` appended for spot capacity."""
    if price is None:
        return ""
    text = f"${price:.4f}".rstrip("0").rstrip(".")
    return f"{text} (spot)" if spot else text


def format_max_price(price: float | None) -> str:
    """A plan's max price, or ``off``."""
    if not price:
        return "off"
    return f"${price:3f}".rstrip("0").rstrip(".")


# ---- resources ----------------------------------------------------------------------------


def pretty_resources(
    *,
    cpus: Any = None,
    cpu_arch: Any = None,
    memory: Any = None,
    disk_size: Any = None,
    gpu_count: Any = None,
    gpu_vendor: Any = None,
    gpu_name: Any = None,
    gpu_memory: Any = None,
    total_gpu_memory: Any = None,
    compute_capability: Any = None,
) -> str:
    """``cpu=x86:2.. mem=8GB.. disk=100GB.. gpu=A100:40GB:2`` (dstack's ``pretty_resources``)."""
    parts = []
    if cpus is not None and cpus != "":
        prefix = f"{str(cpu_arch).lower()}:" if cpu_arch else ""
        parts.append(f"cpu={prefix}{cpus}")
    if memory is not None and memory != "":
        parts.append(f"mem={memory}")
    if disk_size:
        parts.append(f"disk={disk_size}")
    if gpu_count:
        gpu_parts = [str(p) for p in (gpu_memory, gpu_count, total_gpu_memory, compute_capability) if p]
        head = gpu_name or gpu_vendor
        parts.append("gpu=" + ":".join(([str(head)] if head else []) + gpu_parts))
    return " ".join(parts)


def format_resources_spec(resources: JSON | None) -> str:
    """A normalised ``ResourcesSpec`` (requirements, fleet resources) in dstack's short form."""
    if not resources:
        return ""
    cpu = resources.get("cpu")
    cpu_arch = None
    if isinstance(cpu, dict) and "count" in cpu:
        cpu_arch = cpu.get("arch")
        cpus = format_range(cpu.get("count"))
    else:
        cpus = format_range(cpu)
    kwargs: dict[str, Any] = {
        "cpus": cpus or None,
        "cpu_arch": cpu_arch,
        "memory": format_range(resources.get("memory"), "GB") or None,
    }
    gpu = resources.get("gpu")
    if isinstance(gpu, dict):
        names = gpu.get("name")
        cc = gpu.get("compute_capability")
        kwargs.update(
            gpu_vendor=gpu.get("vendor"),
            gpu_name=",".join(names) if isinstance(names, list) else names,
            gpu_count=format_range(gpu.get("count")) or None,
            gpu_memory=format_range(gpu.get("memory"), "GB") or None,
            total_gpu_memory=format_range(gpu.get("total_memory"), "GB") or None,
            compute_capability=".".join(map(str, cc)) if isinstance(cc, list) else cc,
        )
    elif gpu is not None:
        kwargs["gpu_count"] = str(gpu)
    disk = resources.get("disk")
    if isinstance(disk, dict):
        kwargs["disk_size"] = format_range(disk.get("size"), "GB") or None
    elif disk is not None:
        kwargs["disk_size"] = str(disk)
    return pretty_resources(**kwargs)


def format_instance_resources(resources: JSON | None, include_spot: bool = False, gpu_only: bool = False) -> str:
    """An instance's ``Resources`` as ``cpu=8 mem=32GB disk=100GB gpu=A100:80GB:2``."""
    if not resources:
        return "-" if gpu_only else ""
    gpus = resources.get("gpus") or []
    spot = bool(resources.get("spot"))
    gpu_kwargs: dict[str, Any] = {}
    if gpus:
        gpu = gpus[0]
        gpu_kwargs = {"gpu_name": gpu.get("name"), "gpu_count": len(gpus)}
        if (gpu.get("memory_mib") or 0) > 0:
            gpu_kwargs["gpu_memory"] = format_mib_as_gb(gpu["memory_mib"])
    if gpu_only:
        if not gpus:
            return "-"
        output = pretty_resources(**gpu_kwargs)
    else:
        kwargs: dict[str, Any] = dict(gpu_kwargs)
        cpus = resources.get("cpus") or 0
        if cpus > 0:
            kwargs["cpus"] = cpus
            kwargs["cpu_arch"] = resources.get("cpu_arch")
        if (resources.get("memory_mib") or 0) > 0:
            kwargs["memory"] = format_mib_as_gb(resources["memory_mib"])
        disk_mib = (resources.get("disk") or {}).get("size_mib") or 0
        if disk_mib > 0:
            kwargs["disk_size"] = format_mib_as_gb(disk_mib)
        output = pretty_resources(**kwargs)
    if include_spot and spot:
        output += " (spot)"
    return output


def format_backend(backend: str | None, region: str | None = None, corral_backend: Any = None) -> str:
    """``aws (us-east-1)``; ``remote`` shows as ``ssh``, or as corral's own backend name if given."""
    if not backend:
        return "-"
    if corral_backend:
        name = str(corral_backend)
    elif backend == "remote" and region == "local":
        return "local"  # corral's local backend, when the object lacks `corral_backend`
    else:
        name = "ssh" if backend == "remote" else backend
    return f"{name} ({region})" if region and region != name else name


def format_nodes(nodes: Any) -> str:
    """A fleet's ``nodes`` in the list: ``0..3``, ``2``, ``1..``."""
    if not isinstance(nodes, dict):
        return "" if nodes is None else str(nodes)
    lo, hi = nodes.get("min"), nodes.get("max")
    if lo == hi:
        return str(lo)
    if hi is None:
        return f"{lo}.."
    return f"{lo}..{hi}"


def format_nodes_spec(nodes: Any) -> str:
    """A fleet's ``nodes`` in a plan: ``min=0 target=0 max=3`` (dstack's ``FleetNodesSpec``)."""
    if not isinstance(nodes, dict):
        return "-" if nodes is None else str(nodes)
    lo = nodes.get("min", 0)
    target = nodes.get("target", lo)
    return f"min={lo} target={target} max={nodes.get('max')}"


# ---- durations and dates ------------------------------------------------------------------


def format_duration(seconds: int) -> str:
    """3600 -> ``1h``, 90 -> ``90s`` (dstack's ``format_pretty_duration``)."""
    if seconds <= 0:
        return "0s"
    for unit, mult in _DURATION_UNITS:
        if seconds % mult == 0:
            return f"{seconds // mult}{unit}"
    return f"{seconds}s"


def parse_duration(value: Any) -> int | None:
    """``"5m"`` -> 300, ``300`` -> 300, ``"off"``/``False``/``-1`` -> -1, None -> None."""
    if value is None:
        return None
    if value is False or value == "off":
        return -1
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    m = _DURATION_RE.match(str(value).strip().lower())
    if not m:
        return None
    unit = m.group(2) or "s"
    mult = _UNIT_SECONDS.get(unit) or dict(_DURATION_UNITS)[unit]
    return int(m.group(1)) * mult


def parse_time(value: str | None) -> datetime | None:
    """An ISO-8601 timestamp from the API (``...Z`` or with an offset) as an aware datetime."""
    if not value:
        return None
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def pretty_date(value: str | None, now: datetime | None = None) -> str:  # noqa: C901
    """``now``, ``42 sec ago``, ``3 mins ago``, ``yesterday`` ... (dstack's ``pretty_date``)."""
    dt = parse_time(value)
    if dt is None:
        return ""
    now = now or datetime.now(timezone.utc)
    diff = now - dt
    if diff.days < 0:
        return "now" if diff.total_seconds() > -60 else ""
    secs = diff.seconds
    if diff.days == 0:
        if secs < 10:
            return "now"
        if secs < 60:
            return f"{secs} sec ago"
        if secs < 120:
            return "1 min ago"
        if secs < 3600:
            return f"{round(secs / 60)} mins ago"
        if secs < 7200:
            return "1 hour ago"
        return f"{round(secs / 3600)} hours ago"
    if diff.days == 1:
        return "yesterday"
    if diff.days < 7:
        return f"{diff.days} days ago"
    if diff.days < 31:
        weeks = round(diff.days / 7)
        return f"{weeks} week ago" if weeks == 1 else f"{weeks} weeks ago"
    if diff.days < 365:
        months = round(diff.days / 30)
        return f"{months} month ago" if months == 1 else f"{months} months ago"
    years = round(diff.days / 365)
    return f"{years} year ago" if years == 1 else f"{years} years ago"


# ---- statuses -----------------------------------------------------------------------------

FINISHED_RUN_STATUSES = frozenset({"terminated", "failed", "done"})
FINISHED_JOB_STATUSES = frozenset({"terminated", "aborted", "failed", "done"})


def job_status_text(submission: JSON) -> str:
    """The job's status word as ``ps`` shows it: the server's ``status_message``, else derived
    as dstack's server derives it (``exited (N)``, ``no capacity``, ``stopped``, ...)."""
    if submission.get("status_message"):
        return str(submission["status_message"])
    status = str(submission.get("status") or "")
    reason = submission.get("termination_reason")
    if status == "done":
        return "exited (0)"
    if status == "failed":
        if reason == "container_exited_with_error":
            return f"exited ({submission.get('exit_status')})"
        if reason == "failed_to_start_due_to_no_capacity":
            if "No matching fleet found" in str(submission.get("termination_reason_message") or ""):
                return "no fleets"
            return "no capacity"
        if reason == "interrupted_by_no_capacity":
            return "interrupted"
        return "error"
    if status == "terminated":
        if reason == "terminated_by_user":
            return "stopped"
        if reason == "aborted_by_user":
            return "aborted"
    return status


def run_status_text(run: JSON) -> str:
    """The run's status as ``ps`` shows it (the latest job's message once the run finished)."""
    latest = run.get("latest_job_submission")
    if run.get("status") in FINISHED_RUN_STATUSES and latest:
        return job_status_text(latest)
    return str(run.get("status_message") or run.get("status") or "")


def status_style(text: str, status: str) -> str:
    """A Rich style for a status word (dstack's colours)."""
    if text in ("no capacity", "interrupted"):
        color = "gold1"
    elif text in ("no fleets", "error") or (text.startswith("exited (") and text != "exited (0)"):
        color = "indian_red1"
    else:
        color = {
            "pending": "white",
            "submitted": "grey58",
            "provisioning": "deep_sky_blue1",
            "pulling": "sea_green3",
            "running": "sea_green3",
            "terminating": "deep_sky_blue1",
            "failed": "indian_red1",
            "aborted": "gold1",
            "idle": "sea_green3",
            "busy": "deep_sky_blue1",
            "pending_instance": "deep_sky_blue1",
            "active": "grey58",
        }.get(status, "grey58")
    finished = status in FINISHED_RUN_STATUSES or status in FINISHED_JOB_STATUSES
    return color if finished else f"bold {color}"


def merged_profile(spec: JSON, fleet: bool = False) -> JSON:
    """dstack's ``merged_profile``: the spec's ``profile`` overridden by the configuration's
    non-null profile parameters (it is not sent on the wire, so clients compute it). Fleets
    default to ``on-demand`` spot policy, as dstack's ``FleetSpec`` does."""
    merged: JSON = dict(spec.get("profile") or {})
    conf = spec.get("configuration") or {}
    for key in (
        "creation_policy",
        "idle_duration",
        "spot_policy",
        "max_price",
        "max_duration",
        "retry",
        "backends",
        "regions",
        "fleets",
        "reservation",
    ):
        if conf.get(key) is not None:
            merged[key] = conf[key]
    if merged.get("creation_policy") is None:
        merged["creation_policy"] = "reuse-or-create"
    if fleet and merged.get("spot_policy") is None:
        merged["spot_policy"] = "on-demand"
    return merged


def format_retry(retry: Any) -> str:
    """A job's retry policy: ``1h[no-capacity, error]`` or ``off``."""
    if not isinstance(retry, dict):
        return "off"
    duration = parse_duration(retry.get("duration"))
    events = ", ".join(str(e) for e in retry.get("on_events") or [])
    return f"{format_duration(duration or 0)}[{events}]"


def format_spot(spot: Any) -> str:
    """A requirement's ``spot`` flag as a spot policy."""
    if spot is None:
        return "auto"
    return "spot" if spot else "on-demand"


def proxy_url(server_url: str, url: str) -> str:
    """A service's URL as users open it: a full URL as is, a path joined onto the server's URL (dstack's
    ``make_proxy_url``)."""
    if url.startswith(("http://", "https://")):
        return url
    return server_url.rstrip("/") + "/" + url.lstrip("/")
