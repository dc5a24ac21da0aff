"""Build the agent as a self-contained zipapp (``python3 -I agent.pyz serve ...``).

The archive holds a stub ``corral/__init__.py``, the ``corral/agent`` package (``.py`` files
only) and a ``__main__.py`` that calls :func:`corral.agent.cli.main`. The zip comment carries
a hash of the contents: a target that already holds the same build is left alone.

The archive is written by :mod:`corral.zipapps` (the gateway's is too), which is imported when a build is
asked for: it runs where the archive is built and is not shipped in it, so this module, which is, imports
nothing but the standard library there.
"""

from __future__ import annotations

import pathlib

_PKG_DIR = pathlib.Path(__file__).resolve().parent
_STUB_INIT = b'"""corral (only the host agent is shipped in this archive)."""\n'
_MAIN = b"import sys\n\nfrom corral.agent.cli import main\n\nsys.exit(main())\n"


def _members() -> list[tuple[str, bytes]]:
    from corral.zipapps import package_members

    return [("__main__.py", _MAIN), ("corral/__init__.py", _STUB_INIT), *package_members(_PKG_DIR, "corral/agent/")]


def content_hash() -> str:
    from corral import zipapps

    return zipapps.content_hash(_members())


def build_zipapp(target: pathlib.Path) -> pathlib.Path:
    """Write the agent zipapp to ``target`` (atomically) unless it is already up to date."""
    from corral.zipapps import write_zipapp

    return write_zipapp(target, _members())
