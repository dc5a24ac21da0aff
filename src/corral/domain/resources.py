"""Resource requirements and what an instance offers, with dstack's resource grammar.

Memory and disk sizes are GB as floats (`512MB` = 0.5, `1TB` = 1024); instance sizes are MiB as
ints. A `Range` bound of None is open. `match_requirements` says why an instance does not fit,
or None when it does. The text helpers (`parse_*`, `split_*`, `format_*`, `describe`) implement
dstack's shorthands: `2..8`, `8GB..`, `..4`, `A100:80GB:2`, `nvidia:2..`, `H100,H200:8`,
`x86:4..`, `arm:8`. Pure: standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from corral.domain import compute_capability

N = TypeVar("N", int, float)

GPU_VENDORS = ("nvidia", "amd", "google", "intel", "tenstorrent")
GPU_VENDOR_ALIASES = {"tpu": "google", "tt": "tenstorrent"}
CPU_ARCHES = ("x86", "arm")


@dataclass(frozen=True)
class Range(Generic[N]):
    """A closed interval; a None bound is open. `Range(2, None)` is `2..`."""

    min: N | None = None
    max: N | None = None

    def __post_init__(self) -> None:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"invalid range order: {self.min}..{self.max} (min must not exceed max)")

    def contains(self, value: float) -> bool:
        if self.min is not None and value < self.min:
            return False
        return not (self.max is not None and value > self.max)

    def __str__(self) -> str:
        return format_range(self)


@dataclass(frozen=True)
class GpuSpec:
    """GPU requirements. `count` 0.. means "any number, including none"."""

    vendor: str | None = None
    names: tuple[str, ...] | None = None
    count: Range[int] = field(default_factory=lambda: Range(1, None))
    memory: Range[float] | None = None
    total_memory: Range[float] | None = None
    compute_capability: tuple[int, int] | None = None


@dataclass(frozen=True)
class Requirements:
    """What a job needs from one instance (dstack's `ResourcesSpec`, in plain values)."""

    cpu_arch: str | None = None
    cpu_count: Range[int] = field(default_factory=lambda: Range(2, None))
    memory: Range[float] = field(default_factory=lambda: Range(8.0, None))
    disk: Range[float] | None = field(default_factory=lambda: Range(100.0, None))
    shm_size: float | None = None
    gpu: GpuSpec | None = field(default_factory=lambda: GpuSpec(count=Range(0, None)))


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_mib: int
    vendor: str = "nvidia"


@dataclass(frozen=True)
class InstanceResources:
    cpus: int
    memory_mib: int
    gpus: tuple[Gpu, ...] = ()
    spot: bool = False
    disk_size_mib: int = 0
    cpu_arch: str | None = None


# ---------------------------------------------------------------- grammar: parsing


def parse_memory(value: object) -> float:
    """GB from a number (GB) or a string with an optional `MB`/`GB`/`TB` unit, case-insensitive."""
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.replace(" ", "").lower()
        try:
            if text.endswith("tb"):
                return float(text[:-2]) * 1024
            if text.endswith("gb"):
                return float(text[:-2])
            if text.endswith("mb"):
                return float(text[:-2]) / 1024
            return float(text)
        except ValueError:
            pass
    raise ValueError(f"invalid memory size {value!r}: use a number of GB or e.g. 512MB, 16GB, 1TB")


def split_range(value: object) -> tuple[object, object] | None:
    """The (min, max) of a range shorthand: `a..b`, `a..`, `..b` or a scalar `n` (min = max = n).

    Returns None when `value` is not a shorthand (e.g. a mapping), so callers validate it as is.
    """
    if isinstance(value, str) and ".." in value:
        parts = value.replace(" ", "").split("..")
        if len(parts) != 2:
            raise ValueError(f"invalid range {value!r}: use N, MIN..MAX, MIN.. or ..MAX")
        return (parts[0] or None, parts[1] or None)
    if isinstance(value, (str, int, float)):
        return (value, value)
    return None


def _check_range(rng: Range[N]) -> Range[N]:
    if rng.min is None and rng.max is None:
        raise ValueError("invalid empty range '..': give a minimum, a maximum or both")
    return rng


def parse_int_range(value: object) -> Range[int]:
    """A count range from `4`, `"2..8"`, `"2.."`, `"..8"`; `..` and min > max are rejected."""
    bounds = split_range(value)
    if bounds is None:
        raise ValueError(f"invalid range {value!r}")
    lo, hi = (None if b is None else _to_int(b) for b in bounds)
    return _check_range(Range(lo, hi))


def parse_memory_range(value: object) -> Range[float]:
    """A GB range from `16`, `"16GB"`, `"16GB..80GB"`, `"512MB.."`."""
    bounds = split_range(value)
    if bounds is None:
        raise ValueError(f"invalid memory range {value!r}")
    lo, hi = (None if b is None else parse_memory(b) for b in bounds)
    return _check_range(Range(lo, hi))


def _to_int(value: object) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value)
    raise ValueError(f"invalid integer {value!r}")


def normalize_gpu_vendor(value: str) -> str:
    text = value.lower()
    text = GPU_VENDOR_ALIASES.get(text, text)
    if text not in GPU_VENDORS:
        raise ValueError(f"unknown GPU vendor {value!r}: use one of {', '.join(GPU_VENDORS)} (or tpu, tt)")
    return text


def normalize_cpu_arch(value: str) -> str:
    text = value.lower()
    if text not in CPU_ARCHES:
        raise ValueError(f"unknown CPU architecture {value!r}: use x86 or arm")
    return text


def split_gpu_spec(text: str) -> dict[str, object]:
    """Tokens of a GPU shorthand, in any order: vendor, name(s), memory (has a unit), count.

    `"A100:80GB:2"` -> `{"name": ["A100"], "memory": "80GB", "count": "2"}`. Values stay text for
    the caller to validate (count as an int range, memory as a memory range).
    """
    spec: dict[str, object] = {}

    def put(key: str, value: object, token: str) -> None:
        if key in spec:
            raise ValueError(
                f"invalid GPU spec {text!r}: more than one {key} ({token!r}); "
                "write [VENDOR:]NAME[,NAME...][:MEMORY][:COUNT] in any order, e.g. A100:80GB:2"
            )
        spec[key] = value

    for token in text.replace(" ", "").split(":"):
        if not token:
            raise ValueError(f"invalid GPU spec {text!r}: empty token; use e.g. A100:80GB:2")
        try:
            vendor: str | None = normalize_gpu_vendor(token)
        except ValueError:
            vendor = None
        if vendor is not None:
            put("vendor", vendor, token)
        elif token[0].isalpha():
            names = token.split(",")
            if any(not name for name in names):
                raise ValueError(f"invalid GPU spec {text!r}: empty GPU name in {token!r}")
            put("name", names, token)
        elif any(c.isalpha() for c in token):
            put("memory", token, token)
        else:
            put("count", token, token)
    return spec


def split_cpu_spec(text: str) -> dict[str, object]:
    """Tokens of a CPU shorthand: `"4"`, `"2..8"`, `"arm:8"`, `"x86:4.."` -> `{"arch", "count"}`."""
    spec: dict[str, object] = {}
    for token in text.replace(" ", "").split(":"):
        if not token:
            raise ValueError(f"invalid CPU spec {text!r}: empty token; use e.g. 4, 2..8, arm:8")
        if ".." in token or token.isdigit():
            key, value = "count", token
        else:
            try:
                key, value = "arch", normalize_cpu_arch(token)
            except ValueError:
                raise ValueError(f"invalid CPU spec {text!r}: {token!r} is neither a count nor x86/arm") from None
        if key in spec:
            raise ValueError(f"invalid CPU spec {text!r}: more than one {key} given")
        spec[key] = value
    return spec


def parse_gpu_spec(text: str) -> GpuSpec:
    """A `GpuSpec` from the shorthand; no count means `1..`."""
    spec = split_gpu_spec(text)
    names = spec.get("name")
    memory = spec.get("memory")
    return GpuSpec(
        vendor=str(spec["vendor"]) if "vendor" in spec else None,
        names=tuple(str(n) for n in names) if isinstance(names, list) else None,
        count=parse_int_range(spec["count"]) if "count" in spec else Range(1, None),
        memory=parse_memory_range(memory) if memory is not None else None,
    )


def parse_cpu_spec(text: str) -> tuple[str | None, Range[int]]:
    """(arch, count) from `4`, `2..8`, `arm:8`, `x86:4..`; no count means `2..`."""
    spec = split_cpu_spec(text)
    count = parse_int_range(spec["count"]) if "count" in spec else Range(2, None)
    return (str(spec["arch"]) if "arch" in spec else None, count)


# ---------------------------------------------------------------- grammar: formatting


def format_number(value: float) -> str:
    """Shortest text that reads back as the same number (`8.0` -> `8`, `0.5` -> `0.5`)."""
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return repr(value)
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


def format_memory(gb: float) -> str:
    return f"{format_number(gb)}GB"


def format_range(rng: Range[N], unit: str = "") -> str:
    """dstack's compact range text: `4`, `2..8`, `2..`, `..8`; `unit="GB"` formats memory."""

    def one(value: N | None) -> str:
        if value is None:
            return ""
        return format_memory(value) if unit == "GB" else format_number(value) + unit

    if rng.min == rng.max:
        return one(rng.min)
    return f"{one(rng.min)}..{one(rng.max)}"


def format_cpu_spec(arch: str | None, count: Range[int]) -> str:
    return f"{arch}:{format_range(count)}" if arch else format_range(count)


def format_gpu_spec(spec: GpuSpec) -> str:
    """The GPU shorthand (`nvidia:A100,H100:80GB..:2..`); total memory/compute capability omitted."""
    parts: list[str] = []
    if spec.vendor:
        parts.append(spec.vendor)
    if spec.names:
        parts.append(",".join(spec.names))
    if spec.memory is not None:
        parts.append(format_range(spec.memory, "GB"))
    parts.append(format_range(spec.count))
    return ":".join(parts)


def describe(req: Requirements) -> str:
    """`cpu=2.. mem=8GB.. disk=100GB.. gpu=0..` (dstack's pretty-printed requirements)."""
    cpu = format_range(req.cpu_count)
    parts = [f"cpu={req.cpu_arch + ':' if req.cpu_arch else ''}{cpu}"]
    parts.append(f"mem={format_range(req.memory, 'GB')}")
    if req.disk is not None:
        parts.append(f"disk={format_range(req.disk, 'GB')}")
    if req.gpu is not None:
        gpu = req.gpu
        tokens = [gpu.vendor] if gpu.vendor and not gpu.names else []
        if gpu.names:
            tokens.append(",".join(gpu.names))
        if gpu.memory is not None:
            tokens.append(format_range(gpu.memory, "GB"))
        tokens.append(format_range(gpu.count))
        if gpu.total_memory is not None:
            tokens.append(format_range(gpu.total_memory, "GB"))
        if gpu.compute_capability is not None:
            tokens.append("{}.{}".format(*gpu.compute_capability))
        parts.append("gpu=" + ":".join(tokens))
    return " ".join(parts)


# ---------------------------------------------------------------- matching


def _gb(mib: int) -> float:
    return mib / 1024


def match_requirements(req: Requirements, res: InstanceResources) -> str | None:
    """None if `res` satisfies `req`, otherwise a short reason naming the first unmet requirement.

    GPU filters (vendor, name, memory, compute capability) apply to instances that have GPUs; an instance
    without GPUs fits any GPU spec whose count allows 0. A disk size of 0 is not known (dstack's rule for Slurm
    nodes): it fits any disk requirement. A compute capability is a minimum that only an NVIDIA model of known
    capability meets (``domain/compute_capability.py``), as in dstack 0.22.5.
    """
    if req.cpu_arch and res.cpu_arch and req.cpu_arch != res.cpu_arch:
        return f"needs cpu arch {req.cpu_arch}, instance is {res.cpu_arch}"
    if not req.cpu_count.contains(res.cpus):
        return f"needs cpu {format_range(req.cpu_count)}, instance has {res.cpus}"
    mem = _gb(res.memory_mib)
    if not req.memory.contains(mem):
        return f"needs memory {format_range(req.memory, 'GB')}, instance has {mem:.1f}GB"
    if req.disk is not None and res.disk_size_mib > 0:  # 0: not known (a Slurm node), not matched
        disk = _gb(res.disk_size_mib)
        if not req.disk.contains(disk):
            return f"needs disk {format_range(req.disk, 'GB')}, instance has {disk:.1f}GB"
    if req.gpu is not None:
        return _match_gpu(req.gpu, res.gpus)
    return None


def _match_gpu(spec: GpuSpec, gpus: tuple[Gpu, ...]) -> str | None:
    if not spec.count.contains(len(gpus)):
        return f"needs gpu count {format_range(spec.count)}, instance has {len(gpus)}"
    if not gpus:
        return None
    for gpu in gpus:
        if spec.vendor and gpu.vendor.lower() != spec.vendor:
            return f"needs gpu vendor {spec.vendor}, instance has {gpu.vendor}"
        if spec.names and gpu.name.lower() not in {n.lower() for n in spec.names}:
            return f"needs gpu {','.join(spec.names)}, instance has {gpu.name}"
        if spec.memory is not None and not spec.memory.contains(_gb(gpu.memory_mib)):
            return f"needs gpu memory {format_range(spec.memory, 'GB')}, instance has {_gb(gpu.memory_mib):.1f}GB"
        if spec.compute_capability is not None:
            have = compute_capability.of_gpu(gpu.vendor, gpu.name)
            if have is None or have < spec.compute_capability:
                known = "an unknown one" if have is None else "{}.{}".format(*have)
                return "needs gpu compute capability {}.{}+, instance has {} ({})".format(
                    *spec.compute_capability, gpu.name, known
                )
    if spec.total_memory is not None:
        total = sum(_gb(g.memory_mib) for g in gpus)
        if not spec.total_memory.contains(total):
            return f"needs total gpu memory {format_range(spec.total_memory, 'GB')}, instance has {total:.1f}GB"
    return None
