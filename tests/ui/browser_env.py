"""What the web UI's browser tests need, installed or found (never skipped): Debian's chromium (apt-get, by
``scripts/test.sh``), Playwright for Python (the ``dev`` extra; its own browser download is never used),
and axe-core's ``axe.min.js`` (``npm pack`` of a pinned version, its tarball checked against the npm registry's
integrity hash recorded here, once, into ``~/.cache/corral-tests``)."""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

AXE_VERSION = "4.14.1"
#: ``npm view axe-core@4.14.1 dist.integrity`` (the registry's SRI hash of the tarball), checked before use.
AXE_INTEGRITY = "sha512-FHfa+lmNjQZfJz1q8wKqIDwC6DExcHt/pkjNQb09a3NPjCKg2rhu5qb2S4r76ASyFNNtuFooJpZe37OgudVGtQ=="
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
        tgz = Path(tmp) / f"axe-core-{AXE_VERSION}.tgz"
        got = "sha512-" + base64.b64encode(hashlib.sha512(tgz.read_bytes()).digest()).decode()
        if got != AXE_INTEGRITY:
            raise RuntimeError(f"axe-core@{AXE_VERSION}'s tarball is {got}, not the pinned {AXE_INTEGRITY}")
        with tarfile.open(tgz) as tar:
            member = tar.extractfile("package/axe.min.js")
            assert member is not None
            data = member.read()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.with_suffix(".tmp").write_bytes(data)
        target.with_suffix(".tmp").rename(target)
    return target
