"""`resources:` — ranges, CPU, memory, GPU and disk specs with dstack's shorthands, serialised in
dstack's normalised JSON (`cpu: "1.."` -> `{"arch": null, "count": {"min": 1, "max": null}}`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Annotated, Any, Optional

from pydantic import Field, PlainSerializer, PlainValidator, field_validator, model_validator
from typing_extensions import Self

from corral.config.common import CoreModel, Memory
from corral.domain import resources as domain
from corral.domain.resources import normalize_cpu_arch, normalize_gpu_vendor, split_range


class _RangeBase(CoreModel):
    """Shorthand parsing and the empty/order checks; subclasses fix the bound type."""

    min: Any = None
    max: Any = None

    @model_validator(mode="before")
    @classmethod
    def _parse_shorthand(cls, value: Any) -> Any:
        bounds = split_range(value)
        if bounds is None:
            return value
        return {"min": bounds[0], "max": bounds[1]}

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.min is None and self.max is None:
            raise ValueError("invalid empty range '..': give a minimum, a maximum or both (e.g. 2..8)")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"invalid range order: {self.min}..{self.max}; the minimum must come first")
        return self


class IntRange(_RangeBase):
    """A count range: `4`, `2..8`, `2..`, `..8` or `{min, max}`."""

    min: Optional[int] = None
    max: Optional[int] = None

    def to_domain(self) -> domain.Range[int]:
        return domain.Range(self.min, self.max)

    def __str__(self) -> str:
        return domain.format_range(self.to_domain())


class MemoryRange(_RangeBase):
    """A size range in GB: `16GB`, `16GB..80GB`, `512MB..`, `..1TB` or `{min, max}`."""

    min: Optional[Memory] = None
    max: Optional[Memory] = None

    def to_domain(self) -> domain.Range[float]:
        return domain.Range(self.min, self.max)

    def __str__(self) -> str:
        return domain.format_range(self.to_domain(), "GB")


class CPUArchitecture(str, Enum):
    X86 = "x86"
    ARM = "arm"


class AcceleratorVendor(str, Enum):
    NVIDIA = "nvidia"
    AMD = "amd"
    GOOGLE = "google"
    INTEL = "intel"
    TENSTORRENT = "tenstorrent"


def _default_cpu_count() -> IntRange:
    return IntRange(min=2)


class CPUSpec(CoreModel):
    """`4`, `2..8`, `arm:8`, `x86:4..`, `{min, max}` or `{arch, count}`."""

    arch: Optional[CPUArchitecture] = None
    count: IntRange = Field(default_factory=_default_cpu_count)

    @model_validator(mode="before")
    @classmethod
    def _parse_shorthand(cls, value: Any) -> Any:
        if isinstance(value, int):
            value = str(value)
        if isinstance(value, str):
            return domain.split_cpu_spec(value)
        if isinstance(value, IntRange):
            return {"arch": None, "count": value}
        if isinstance(value, Mapping) and value and set(value) <= {"min", "max"}:
            return {"arch": None, "count": value}
        return value

    @field_validator("arch", mode="before")
    @classmethod
    def _arch(cls, value: Any) -> Any:
        if isinstance(value, str) and not isinstance(value, CPUArchitecture):
            return normalize_cpu_arch(value)
        return value


def _compute_capability(value: Any) -> tuple[int, int]:
    if isinstance(value, float):
        value = str(value)
    if isinstance(value, str):
        value = value.strip().split(".")
    if isinstance(value, (tuple, list)) and len(value) == 2:
        try:
            return int(value[0]), int(value[1])
        except (TypeError, ValueError):
            pass
    raise ValueError(f"invalid compute capability {value!r}: use MAJOR.MINOR, e.g. 7.5")


ComputeCapability = Annotated[
    tuple[int, int], PlainValidator(_compute_capability), PlainSerializer(list, return_type=list[int])
]


def _default_gpu_count() -> IntRange:
    return IntRange(min=1)


class GPUSpec(CoreModel):
    """`A100`, `A100:80GB:2`, `24GB..`, `nvidia:2..`, `H100,H200:8`, a count, or the full mapping.

    A spec given without a count means `1..` GPUs.
    """

    vendor: Optional[AcceleratorVendor] = None
    name: Optional[list[str]] = None
    count: IntRange = Field(default_factory=_default_gpu_count)
    memory: Optional[MemoryRange] = None
    total_memory: Optional[MemoryRange] = None
    compute_capability: Optional[ComputeCapability] = None

    @model_validator(mode="before")
    @classmethod
    def _parse_shorthand(cls, value: Any) -> Any:
        if isinstance(value, int):
            value = str(value)
        if isinstance(value, str):
            return domain.split_gpu_spec(value)
        return value

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> Any:
        if value is None:
            return None
        names = value if isinstance(value, list) else [value]
        return [n[4:] if isinstance(n, str) and n.startswith("tpu-") else n for n in names]

    @field_validator("vendor", mode="before")
    @classmethod
    def _vendor(cls, value: Any) -> Any:
        if value is None or isinstance(value, AcceleratorVendor):
            return value
        if isinstance(value, str):
            return normalize_gpu_vendor(value)
        raise ValueError(f"invalid GPU vendor {value!r}: use nvidia, amd, google (tpu), intel or tenstorrent")

    def to_domain(self) -> domain.GpuSpec:
        return domain.GpuSpec(
            vendor=self.vendor.value if self.vendor else None,
            names=tuple(self.name) if self.name else None,
            count=self.count.to_domain(),
            memory=self.memory.to_domain() if self.memory else None,
            total_memory=self.total_memory.to_domain() if self.total_memory else None,
            compute_capability=self.compute_capability,
        )


class DiskSpec(CoreModel):
    """`100GB`, `100GB..`, or `{size: ...}`."""

    size: MemoryRange

    @model_validator(mode="before")
    @classmethod
    def _parse_shorthand(cls, value: Any) -> Any:
        if isinstance(value, (str, int, float)):
            return {"size": value}
        return value


def _default_memory() -> MemoryRange:
    return MemoryRange(min=8.0)


def _default_gpu() -> GPUSpec:
    return GPUSpec(count=IntRange(min=0))


def _default_disk() -> DiskSpec:
    return DiskSpec(size=MemoryRange(min=100.0))


class ResourcesSpec(CoreModel):
    """dstack's `resources`. Defaults: `cpu: 2..`, `memory: 8GB..`, `disk: 100GB..`, gpu count `0..`."""

    cpu: CPUSpec = Field(default_factory=CPUSpec)
    memory: MemoryRange = Field(default_factory=_default_memory)
    shm_size: Optional[Memory] = None
    gpu: Optional[GPUSpec] = Field(default_factory=_default_gpu)
    disk: Optional[DiskSpec] = Field(default_factory=_default_disk)

    def to_requirements(self) -> domain.Requirements:
        return domain.Requirements(
            cpu_arch=self.cpu.arch.value if self.cpu.arch else None,
            cpu_count=self.cpu.count.to_domain(),
            memory=self.memory.to_domain(),
            disk=self.disk.size.to_domain() if self.disk else None,
            shm_size=self.shm_size,
            gpu=self.gpu.to_domain() if self.gpu else None,
        )

    def describe(self) -> str:
        """`cpu=2.. mem=8GB.. disk=100GB.. gpu=0..`."""
        return domain.describe(self.to_requirements())
