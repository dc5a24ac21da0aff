"""GPU models named as dstack names them in a Slurm backend's ``gpu_partitions`` (``[vendor:]name[:memory]``):
``H100``, ``A100:40GB``, ``MI300X``, ``nvidia:X:80GB``. A bare name is looked up in the known models (vendor and
memory inferred, the name normalised: ``RTX 4090`` -> ``RTX4090``); a name with two memory sizes (``A100``: 40 and
80 GB) is ambiguous, an error as in dstack 0.22.5 (``core/backends/slurm/resources.py``, ``GPUModel.from_string``:
"Multiple matching GPU models found"); three fields name any model verbatim.
"""

from __future__ import annotations

from dataclasses import dataclass

VENDORS = ("nvidia", "amd", "intel")

#: (vendor, name, memory in GB) of the accelerators dstack knows: gpuhunt's ``KNOWN_NVIDIA_GPUS``, ``KNOWN_AMD_GPUS``
#: and ``KNOWN_INTEL_ACCELERATORS`` (github.com/dstackai/gpuhunt, src/gpuhunt/_internal/constraints.py). A model
#: missing here is named whole: ``nvidia:H200:141GB``.
KNOWN: tuple[tuple[str, str, int], ...] = (
    ("nvidia", "A10", 24),
    ("nvidia", "A16", 16),
    ("nvidia", "A40", 48),
    ("nvidia", "A100", 40),
    ("nvidia", "A100", 80),
    ("nvidia", "A10G", 24),
    ("nvidia", "A4000", 16),
    ("nvidia", "A4500", 20),
    ("nvidia", "A5000", 24),
    ("nvidia", "A6000", 48),
    ("nvidia", "H100", 80),
    ("nvidia", "H100NVL", 94),
    ("nvidia", "L4", 24),
    ("nvidia", "L40", 48),
    ("nvidia", "L40S", 48),
    ("nvidia", "P100", 16),
    ("nvidia", "RTX3060", 8),
    ("nvidia", "RTX3060", 12),
    ("nvidia", "RTX3060Ti", 8),
    ("nvidia", "RTX3070Ti", 8),
    ("nvidia", "RTX3080", 10),
    ("nvidia", "RTX3080Ti", 12),
    ("nvidia", "RTX3090", 24),
    ("nvidia", "RTX4090", 24),
    ("nvidia", "RTX6000", 24),
    ("nvidia", "RTX2000Ada", 16),
    ("nvidia", "RTX4000Ada", 20),
    ("nvidia", "RTX6000Ada", 48),
    ("nvidia", "T4", 16),
    ("nvidia", "V100", 16),
    ("nvidia", "V100", 32),
    ("amd", "MI100", 32),
    ("amd", "MI210", 64),
    ("amd", "MI250", 128),
    ("amd", "MI250X", 128),
    ("amd", "MI300A", 128),
    ("amd", "MI300X", 192),
    ("amd", "MI308X", 128),
    ("amd", "MI325X", 288),
    ("intel", "Gaudi", 32),
    ("intel", "Gaudi2", 96),
    ("intel", "Gaudi3", 128),
)


@dataclass(frozen=True)
class GpuModel:
    vendor: str
    name: str
    memory_mib: int

    def __str__(self) -> str:
        return f"{self.vendor}:{self.name}:{self.memory_mib // 1024}GB"


def _memory_gb(text: str) -> int | None:
    t = text.strip().upper()
    if t.endswith("GB") and t[:-2].strip().isdigit():
        return int(t[:-2])
    return None


def _matches(name: str, vendor: str | None, memory_gb: int | None) -> list[tuple[str, str, int]]:
    key = name.replace(" ", "").lower()
    return [
        k
        for k in KNOWN
        if k[1].lower() == key and (vendor is None or k[0] == vendor) and (memory_gb is None or k[2] == memory_gb)
    ]


def parse_gpu_model(text: str) -> GpuModel:
    """The model ``text`` names; ``ValueError`` saying what to write when it names none, or several."""
    fields = [f.strip() for f in text.split(":")]
    if not 1 <= len(fields) <= 3 or not all(fields):
        raise ValueError(f"{text!r} is not a GPU model: write [vendor:]name[:memory], e.g. H100, A100:80GB")
    if len(fields) == 3:
        vendor, name, memory = fields
        gb = _memory_gb(memory)
        if vendor.lower() not in VENDORS or gb is None:
            raise ValueError(
                f"{text!r}: write vendor:name:memory with a vendor of {', '.join(VENDORS)}, e.g. nvidia:X:80GB"
            )
        return GpuModel(vendor.lower(), name.replace(" ", ""), gb * 1024)
    vendor_given: str | None = None
    memory_gb: int | None = None
    name = fields[0]
    if len(fields) == 2:
        if fields[0].lower() in VENDORS:
            vendor_given, name = fields[0].lower(), fields[1]
        else:
            memory_gb = _memory_gb(fields[1])
            if memory_gb is None:
                raise ValueError(f"{text!r}: the second field is a vendor's name or a memory size (e.g. A100:80GB)")
    found = _matches(name, vendor_given, memory_gb)
    if not found:
        raise ValueError(
            f"{text!r} is not a known GPU model: name a known one (e.g. H100, A100:80GB, MI300X) "
            "or give it whole as vendor:name:memory (e.g. nvidia:X:80GB)"
        )
    if len(found) > 1:
        sizes = ", ".join(f"{k[1]}:{k[2]}GB" for k in found)
        raise ValueError(
            f"{text!r}: multiple matching GPU models found ({sizes}): say which, e.g. {found[-1][1]}:{found[-1][2]}GB"
        )
    vendor, known_name, gb = found[0]
    return GpuModel(vendor, known_name, gb * 1024)
