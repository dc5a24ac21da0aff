"""A fake ``nvidia-smi`` that prints the captured output of a real one (``tests/data/nvidia-smi/``, each file's
source in its README) for exactly the command lines corral runs, and fails for any other, so that a query the
agent changes without a capture to match fails its tests rather than meeting a made-up answer.

``install(bin_dir)`` writes ``bin_dir/nvidia-smi``; put ``bin_dir`` first on ``PATH``. The sampling query
answers from the "busy" capture while a process whose command line holds :data:`LOAD_MARKER` runs (the GPU
check's load, or its CPU stand-in), else from the "idle" one. Standard library only: it runs as a script.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

H100 = Path(__file__).resolve().parent / "data" / "nvidia-smi" / "h100-80gb-hbm3"
#: A process whose command line holds this makes the GPU "busy" (``scripts/gpu_check.py`` names its load so).
LOAD_MARKER = "gpu-check-load"
HOST_QUERY = ("--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits")
SAMPLE_QUERY = ("--query-gpu=index,memory.used,utilization.gpu", "--format=csv,noheader,nounits")
ANSWERS = {
    (): "nvidia-smi.txt",
    ("-L",): "list-gpus.txt",
    HOST_QUERY: "query-name-memory-driver.csv",
}


def install(bin_dir: Path, fixtures: Path = H100) -> Path:
    """Write the fake ``nvidia-smi`` into ``bin_dir``; returns its path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    fake = bin_dir / "nvidia-smi"
    fake.write_text(
        f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).resolve()))} "
        f'{shlex.quote(str(fixtures))} "$@"\n'
    )
    fake.chmod(0o755)
    return fake


def _loaded() -> bool:
    marker = LOAD_MARKER.encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker in f.read():
                        return True
            except OSError:
                continue
    return False


def answer(fixtures: Path, args: tuple[str, ...]) -> str | None:
    """What the captured ``nvidia-smi`` printed for ``args`` (None: no capture of that command line)."""
    if args == SAMPLE_QUERY:
        return (fixtures / f"query-index-memory-util-{'busy' if _loaded() else 'idle'}.csv").read_text()
    name = ANSWERS.get(args)
    return None if name is None else (fixtures / name).read_text()


def main(argv: list[str]) -> int:
    fixtures, args = Path(argv[0]), tuple(argv[1:])
    out = answer(fixtures, args)
    if out is None:
        print(f"fake nvidia-smi: no captured output for: nvidia-smi {shlex.join(args)}", file=sys.stderr)
        return 2
    sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
