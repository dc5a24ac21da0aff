"""Where a sandboxed job's paths are: the configuration's absolute paths, as they are.

In a sandbox the job sees its own directory tree (``jobs/<id>/workdir``, built by
:mod:`corral.agent.workdir` as a container's filesystem) at ``/``: ``working_dir`` (default
``/workflow``, as dstack's), the repo dir, every ``files:`` target, ``/tmp`` and its home sit at the
paths the configuration names. :func:`binds` lists the few directories (or files) of that tree the
launcher binds over the read-only host (the outermost ones: a target inside the working dir comes with
it). It creates the directories it binds that do not exist yet.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath

from . import workdir
from .protocol import JobSubmission
from .sandbox_types import DEFAULT_WORKING_DIR


def submission(sub: JobSubmission) -> JobSubmission:
    """The submission with dstack's container working dir: ``/workflow`` when none is named, a relative
    one (dstack before 0.20) under it."""
    wd = sub.working_dir
    if wd is not None and wd.startswith(("/", "~")):
        return sub
    return dataclasses.replace(sub, working_dir=posixpath.join(DEFAULT_WORKING_DIR, wd) if wd else DEFAULT_WORKING_DIR)


def inside(lay: workdir.Layout, host: str) -> str:
    """The path the job sees for ``host``, a path of its tree."""
    rel = os.path.relpath(host, lay.root)
    return "/" if rel == "." else "/" + rel


def binds(lay: workdir.Layout, sub: JobSubmission) -> dict[str, str]:
    """The job's own paths (as it sees them) and the host paths of its tree that they are."""
    wanted = {
        "/tmp": os.path.join(lay.root, "tmp"),
        sub.home_dir: workdir.host_path(lay.root, sub.home_dir, lay.root, sub.home_dir),
        inside(lay, lay.working_dir): lay.working_dir,
        inside(lay, lay.repo_dir): lay.repo_dir,
    }
    for archive in sub.file_archives:
        host = workdir.host_path(lay.root, archive.path.rstrip("/") or "/", lay.working_dir, sub.home_dir)
        wanted[inside(lay, host)] = host
    wanted.pop("/", None)
    out: dict[str, str] = {}
    for path in sorted(wanted, key=len):
        if not any(path.startswith(p.rstrip("/") + "/") for p in out):
            out[path] = wanted[path]
    for host in out.values():
        if not os.path.lexists(host):
            os.makedirs(host, exist_ok=True)
    os.chmod(out["/tmp"], 0o1777)
    for vol in sub.volumes:  # instance volumes: the host's directory, at its path (over the job's own)
        if not os.path.isdir(vol.instance_path):
            if vol.optional:
                continue
            os.makedirs(vol.instance_path)  # as Docker does for a bind mount's missing source
        out[posixpath.normpath(vol.path)] = vol.instance_path
    return out
