"""The oldest Python that the zipapps shipped to hosts (the agent, the gateway) support, and where to find one.

Their sources are checked for it statically by ``vermin --target=3.9-`` in scripts/test.sh; the zipapps also run
under it in their tests when such an interpreter is on PATH (or in a pyenv install).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

OLDEST_PYTHON = "3.9"


def find_python(version: str) -> str | None:
    """A working ``python<version>``: on PATH, else a pyenv install of that version (a pyenv shim alone
    may not run when that version is not selected)."""
    pyenv_root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    candidates = [
        shutil.which(f"python{version}"),
        *sorted(glob.glob(f"{pyenv_root}/versions/{version}.*/bin/python3")),
    ]
    for candidate in filter(None, candidates):
        try:
            out = subprocess.run(
                [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip() == version:
            return candidate
    return None
