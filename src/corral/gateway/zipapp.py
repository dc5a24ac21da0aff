"""Build the gateway as a self-contained zipapp (``python3 -I corral-gateway.pyz serve ...``).

The archive holds a stub ``corral/__init__.py`` carrying corral's version, the ``corral/gateway`` package
(``.py`` files only) and a ``__main__.py`` that calls :func:`corral.gateway.cli.main`. It is reproducible (fixed
dates and modes, sorted members) and the zip comment carries a hash of the contents: a target that already holds
the same build is left alone.
"""

from __future__ import annotations

import hashlib
import io
import os
import pathlib
import re
import zipfile

_PKG_DIR = pathlib.Path(__file__).resolve().parent
_MAIN = b"import sys\n\nfrom corral.gateway.cli import main\n\nsys.exit(main())\n"
_SHEBANG = b"#!/usr/bin/env python3\n"
_EPOCH = (1980, 1, 1, 0, 0, 0)


def _version() -> str:
    text = (_PKG_DIR.parent / "__init__.py").read_text()
    m = re.search(r'^__version__ = "([^"]+)"', text, re.MULTILINE)
    return m.group(1) if m else "unknown"


def _members() -> list[tuple[str, bytes]]:
    stub = f'"""corral (only the gateway is shipped in this archive)."""\n\n__version__ = "{_version()}"\n'
    members = [("__main__.py", _MAIN), ("corral/__init__.py", stub.encode())]
    for path in sorted(_PKG_DIR.rglob("*.py")):
        rel = path.relative_to(_PKG_DIR)
        if "__pycache__" in rel.parts:
            continue
        members.append(("corral/gateway/" + rel.as_posix(), path.read_bytes()))
    return members


def content_hash() -> str:
    h = hashlib.sha256()
    for name, data in _members():
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def _existing_hash(target: pathlib.Path) -> str:
    try:
        with zipfile.ZipFile(target) as zf:
            return zf.comment.decode("ascii", "replace")
    except (OSError, zipfile.BadZipFile):
        return ""


def build_zipapp(target: pathlib.Path) -> pathlib.Path:
    """Write the gateway zipapp to ``target`` (atomically) unless it is already up to date."""
    target = pathlib.Path(target)
    digest = content_hash()
    if target.is_file() and _existing_hash(target) == digest:
        return target
    buf = io.BytesIO()
    buf.write(_SHEBANG)  # before the archive, exactly as the stdlib ``zipapp`` module does
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in _members():
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
