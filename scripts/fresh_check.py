"""Which packages a fresh resolve moved past the lock: ``python scripts/fresh_check.py LOCK`` run by the throwaway
venv's interpreter prints each installed distribution whose version differs from the lock's pin (or that the lock
lacks), as ``name  locked -> fresh``. Used by ``scripts/test.sh --fresh``; standard library only."""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def _name(raw: str) -> str:
    return re.sub(r"[-_.]+", "-", raw).lower()


def locked(path: Path) -> dict[str, str]:
    """The lock's pins by normalized name (the first pin of a name wins: the lock has one per name)."""
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        m = PIN.match(line)
        if m:
            pins.setdefault(_name(m.group(1)), m.group(2))
    return pins


def main(lock: str) -> int:
    pins = locked(Path(lock))
    skip = {"corral", "pip"}
    moved = []
    for dist in metadata.distributions():
        name = _name(dist.metadata["Name"])
        if name in skip:
            continue
        if pins.get(name) != dist.version:
            moved.append((name, pins.get(name, "(not in the lock)"), dist.version))
    for name, old, new in sorted(moved):
        print(f"  {name:28} {old} -> {new}")
    if not moved:
        print("  (none: the lock is the newest the ranges allow)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
