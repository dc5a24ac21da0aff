"""A real tmpfs of a given size, mounted for the length of a test (root only: the tests that use it say so), and
how the disk tests measure and fill it."""

from __future__ import annotations

import contextlib
import os
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


MiB = 2**20


def free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path: Path, leave: int = 0) -> Path:
    """A file that takes the disk's free space but ``leave`` bytes (to the last byte when 0)."""
    filler = path / "filler"
    chunk = b"\0" * MiB
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while free(path) - leave >= MiB:
            f.write(chunk)
        while leave == 0:
            f.write(b"\0" * 4096)
    return filler
