"""Code for the repo and `files` tests: real git repositories on disk (a bare repository as the "remote"
and a working copy with a pushed commit, an uncommitted change to a tracked file and an untracked file),
and tar archives built in memory."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

COMMITTED = "committed line"
UNCOMMITTED = "uncommitted line"
UNTRACKED = "untracked file"
_IDENTITY = ("-c", "user.name=Corral Tests", "-c", "user.email=tests@corral.invalid", "-c", "init.defaultBranch=main")


def git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(
        ["git", *_IDENTITY, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )
    assert out.returncode == 0, f"git {' '.join(args)}: {out.stderr}"
    return out.stdout.strip()


@dataclass
class Checkout:
    remote: Path  # the bare repository
    work: Path  # the working copy (branch `main` tracking origin/main)
    first: str  # the first pushed commit
    head: str  # the pushed head (what the diff is made against)


def remote_and_checkout(tmp: Path, name: str = "project") -> Checkout:
    remote = tmp / f"{name}.git"
    work = tmp / name
    git(tmp, "init", "-q", "--bare", str(remote))
    git(tmp, "clone", "-q", str(remote), str(work))
    git(work, "checkout", "-q", "-b", "main")
    (work / "committed.txt").write_text(f"{COMMITTED}\n")
    (work / "docs").mkdir()
    (work / "docs" / "readme.md").write_text("# docs\n")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "first")
    first = git(work, "rev-parse", "HEAD")
    (work / "second.txt").write_text("second\n")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "second")
    git(work, "push", "-q", "-u", "origin", "main")
    head = git(work, "rev-parse", "HEAD")
    # The user's work in progress: a change to a tracked file, a new file, and an ignored one.
    with (work / "second.txt").open("a") as f:
        f.write(f"{UNCOMMITTED}\n")
    (work / "untracked.txt").write_text(f"{UNTRACKED}\n")
    (work / ".gitignore").write_text("*.log\n")
    (work / "noise.log").write_text("ignored\n")
    return Checkout(remote=remote, work=work, first=first, head=head)


def tar_of(files: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    """A tar archive of ``files`` (name -> content) and symlinks (name -> target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()
