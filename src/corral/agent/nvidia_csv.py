"""The values of ``nvidia-smi --query-gpu=... --format=csv,...`` lines, as a real ``nvidia-smi`` prints them.

One line per GPU, fields separated by a comma and a space; numbers with their unit unless ``nounits`` was
asked (``81559 MiB``, ``100 %``); ``[N/A]`` or ``[Not Supported]`` for a value the GPU cannot report (for
instance ``utilization.gpu`` of a GPU in MIG mode). Source: NVIDIA's nvidia-smi(1), "--format" and
"--query-gpu" (https://manpages.ubuntu.com/manpages/focal/man1/nvidia-smi.1.html); captures of each case in
``tests/data/nvidia-smi/``. Standard library only, Python 3.9+.
"""

from __future__ import annotations

import re
from typing import Optional

_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(?:MiB|%|W|MHz|C)?\s*$")


def fields(line: str) -> list[str]:
    """A CSV line's fields, stripped (a GPU name never holds a comma)."""
    return [part.strip() for part in line.split(",")]


def number(text: str) -> Optional[float]:
    """``81559``, ``81559 MiB`` or ``100 %`` -> the number; ``[N/A]``, ``[Not Supported]`` or anything else ->
    None."""
    m = _NUMBER.match(text)
    return float(m.group(1)) if m else None
