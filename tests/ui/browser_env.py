"""What the web UI's browser tests need, installed or found (never skipped): Debian's chromium (apt-get, by
``scripts/test.sh``), Playwright for Python (the ``dev`` extra; its own browser download is never used),
and axe-core's ``axe.min.js`` (``npm pack``, once, into ``~/.cache/corral-tests``)."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

AXE_VERSION = "4.14.1"
CACHE = Path.home() / ".cache" / "corral-tests"


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError(
        "chromium is missing: the web UI's browser tests drive Debian's chromium (apt-get install chromium; "
        "scripts/test.sh installs it)"
    )


def axe_script() -> Path:
    """axe-core's ``axe.min.js`` (MPL-2.0), fetched from npm once and cached."""
    target = CACHE / f"axe-core-{AXE_VERSION}" / "axe.min.js"
    if target.exists():
        return target
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is missing: the accessibility audit fetches axe-core with it (apt-get install npm)")
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [npm, "pack", f"axe-core@{AXE_VERSION}", "--silent"], cwd=tmp, capture_output=True, text=True, timeout=300
        )
        if out.returncode != 0:
            raise RuntimeError(f"npm pack axe-core@{AXE_VERSION} failed: {out.stderr.strip()}")
        with tarfile.open(Path(tmp) / f"axe-core-{AXE_VERSION}.tgz") as tar:
            member = tar.extractfile("package/axe.min.js")
            assert member is not None
            data = member.read()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.with_suffix(".tmp").write_bytes(data)
        target.with_suffix(".tmp").rename(target)
    return target
