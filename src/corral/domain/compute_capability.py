"""The CUDA compute capability of NVIDIA GPU models, by the names corral gives GPUs (``A100``, ``RTX4090``).

A job's ``resources.gpu.compute_capability`` is a minimum, as in dstack 0.22.5
(``core/backends/base/offers.py``, ``gpu_matches_gpu_spec``): a GPU fits when it is an NVIDIA model whose
capability is known and at least the one asked; any other GPU does not. Pure; imports nothing of corral.
"""

from __future__ import annotations

#: gpuhunt 0.1.34's ``KNOWN_NVIDIA_GPUS`` (github.com/dstackai/gpuhunt, src/gpuhunt/_internal/constraints.py),
#: the table dstack 0.22.5 matches against; NVIDIA lists the same values at developer.nvidia.com/cuda-gpus.
KNOWN: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("P100",), (6, 0)),
    **dict.fromkeys(("V100",), (7, 0)),
    **dict.fromkeys(
        ("T4", "RTX6000", "RTX2060", "RTX2060SUPER", "RTX2070", "RTX2070SUPER", "RTX2080", "RTX2080SUPER"),
        (7, 5),
    ),
    "RTX2080Ti": (7, 5),
    "A100": (8, 0),
    **dict.fromkeys(
        ("A10", "A10G", "A16", "A40", "A4000", "A4500", "A5000", "A6000", "RTX3050", "RTX3060", "RTX3060Ti"),
        (8, 6),
    ),
    **dict.fromkeys(("RTX3070", "RTX3070Ti", "RTX3080", "RTX3080Ti", "RTX3090", "RTX3090Ti"), (8, 6)),
    **dict.fromkeys(
        ("L4", "L40", "L40S", "RTX2000Ada", "RTX4000Ada", "RTX6000Ada", "RTX4060", "RTX4060Ti", "RTX4070"),
        (8, 9),
    ),
    **dict.fromkeys(("RTX4070SUPER", "RTX4070Ti", "RTX4070TiSUPER", "RTX4080", "RTX4080SUPER", "RTX4090"), (8, 9)),
    **dict.fromkeys(("GH200", "H100", "H100NVL", "H200", "H200NVL"), (9, 0)),
    **dict.fromkeys(("B200", "B300", "GB200", "GB300"), (10, 0)),
    **dict.fromkeys(
        ("RTX5060", "RTX5060Ti", "RTX5070", "RTX5070Ti", "RTX5080", "RTX5090", "RTXPRO4500", "RTXPRO6000"),
        (12, 0),
    ),
}

_BY_LOWER = {name.lower(): cc for name, cc in KNOWN.items()}


def of_gpu(vendor: str, name: str) -> tuple[int, int] | None:
    """The compute capability of an NVIDIA GPU named as corral names it; None for another vendor's or an unknown
    model."""
    if vendor.lower() != "nvidia":
        return None
    return _BY_LOWER.get(name.lower())
