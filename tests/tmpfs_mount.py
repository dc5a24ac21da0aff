"""A real tmpfs of a given size, mounted for the length of a test (root only: the tests that use it say so)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def tmpfs(path: Path, size: int | str) -> Iterator[Path]:
    """``path`` with a tmpfs of ``size`` (bytes, or mount's notation such as ``1m``) mounted on it."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
