"""Building corral's zipapps: a package of ``.py`` files written as a self-contained, reproducible archive
(``python3 -I NAME.pyz ...``), the way the host agent (:mod:`corral.agent.zipapp`) and the gateway
(:mod:`corral.gateway.zipapp`) are shipped.

Owns: the members of an archive (a ``__main__.py``, a stub ``corral/__init__.py`` and one package's sources,
sorted), their content hash (carried in the zip comment, so that a target already holding the same build is
left alone), and the archive itself: a shebang line before it as the standard library's ``zipapp`` writes,
fixed dates and modes, written atomically. It runs where the archives are built (the server, the tests) and is
shipped in neither archive: each archive's own ``zipapp`` module imports it on first use.

May import: the standard library only (no corral package).
"""

from __future__ import annotations

import hashlib
import io
import os
import pathlib
import zipfile

SHEBANG = b"#!/usr/bin/env python3\n"
_EPOCH = (1980, 1, 1, 0, 0, 0)

#: One archive member: its name in the archive and its bytes.
Member = tuple[str, bytes]


def package_members(pkg_dir: pathlib.Path, prefix: str) -> list[Member]:
    """The ``.py`` files under ``pkg_dir`` (sorted, no ``__pycache__``), named ``prefix`` + their relative path."""
    members = []
    for path in sorted(pkg_dir.rglob("*.py")):
        rel = path.relative_to(pkg_dir)
        if "__pycache__" in rel.parts:
            continue
        members.append((prefix + rel.as_posix(), path.read_bytes()))
    return members


def content_hash(members: list[Member]) -> str:
    """A hash of the members' names and contents, in their order."""
    h = hashlib.sha256()
    for name, data in members:
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def _existing_hash(target: pathlib.Path) -> str:
    try:
        with zipfile.ZipFile(target) as zf:
            return zf.comment.decode("ascii", "replace")
    except (OSError, zipfile.BadZipFile):
        return ""


def write_zipapp(target: pathlib.Path, members: list[Member]) -> pathlib.Path:
    """Write ``members`` as a zipapp to ``target`` (atomically) unless it already holds the same build."""
    target = pathlib.Path(target)
    digest = content_hash(members)
    if target.is_file() and _existing_hash(target) == digest:
        return target
    buf = io.BytesIO()
    buf.write(SHEBANG)  # before the archive, exactly as the stdlib ``zipapp`` module does
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in members:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
        zf.comment = digest.encode("ascii")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(buf.getvalue())
    tmp.chmod(0o755)
    os.replace(tmp, target)
    return target
