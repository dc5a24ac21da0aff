"""Build the gateway as a self-contained zipapp (``python3 -I corral-gateway.pyz serve ...``).

The archive holds a stub ``corral/__init__.py`` carrying corral's version, the ``corral/gateway`` package
(``.py`` files only) and a ``__main__.py`` that calls :func:`corral.gateway.cli.main`. It is reproducible (fixed
dates and modes, sorted members) and the zip comment carries a hash of the contents: a target that already holds
the same build is left alone.

The archive is written by :mod:`corral.zipapps` (the agent's is too), which is imported when a build is asked
for: it runs where the archive is built and is not shipped in it, so this module, which is, imports nothing but
the standard library there.
"""

from __future__ import annotations

import pathlib
import re

_PKG_DIR = pathlib.Path(__file__).resolve().parent
_MAIN = b"import sys\n\nfrom corral.gateway.cli import main\n\nsys.exit(main())\n"


def _version() -> str:
    text = (_PKG_DIR.parent / "__init__.py").read_text()
    m = re.search(r'^__version__ = "([^"]+)"', text, re.MULTILINE)
    return m.group(1) if m else "unknown"


def _members() -> list[tuple[str, bytes]]:
    from corral.zipapps import package_members

    stub = f'"""corral (only the gateway is shipped in this archive)."""\n\n__version__ = "{_version()}"\n'
    package = package_members(_PKG_DIR, "corral/gateway/")
    return [("__main__.py", _MAIN), ("corral/__init__.py", stub.encode()), *package]


def content_hash() -> str:
    from corral import zipapps

    return zipapps.content_hash(_members())


def build_zipapp(target: pathlib.Path) -> pathlib.Path:
    """Write the gateway zipapp to ``target`` (atomically) unless it is already up to date."""
    from corral.zipapps import write_zipapp

    return write_zipapp(target, _members())
