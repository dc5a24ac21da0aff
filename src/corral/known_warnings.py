"""Python warnings in corral's processes: the known, harmless ones from dependencies are filtered by their exact
module and category, and every other one goes through :mod:`logging` instead of being printed raw.

Why: ``print``-style warning lines broke the server's JSON log (one JSON object a line, ``CORRAL_LOG_FORMAT=json``)
and landed in the middle of a job's output under ``corral apply``/``attach``/``logs``.

- The server (``corral.server_logs.configure``) captures warnings into the ``py.warnings`` logger, so they come out
  in the log's own format, at WARNING.
- The CLI (``corral.cli.main``) captures them too and shows them only with ``CORRAL_DEBUG=1``: a user's terminal
  carries corral's lines and the job's, never a dependency's notice about itself.

Known warnings, each by its exact origin:

- ``cryptography.utils.CryptographyDeprecationWarning`` "DSA is deprecated and support will be removed in a future
  release", which cryptography raises (seen in 51.0.1: ``_DSA_DEPRECATION_MSG`` in
  ``cryptography/hazmat/primitives/asymmetric/dsa.py``) when a module reads the ``dsa`` key types. asyncssh (2.24)
  reads them at import, in ``asyncssh.crypto.misc`` and ``asyncssh.crypto.dsa``, to build its type aliases, whether
  or not a DSA key is ever used: the warning says nothing about a key in use (the keys corral makes are Ed25519).

Standard library only at import (the CLI's start path); cryptography is imported when the filters are installed.
"""

from __future__ import annotations

import logging
import os
import warnings

#: (module regex, message regex) of each known third-party warning; the category is added in :func:`install_filters`.
ASYNCSSH_DSA = (r"asyncssh\.crypto\.(misc|dsa)\Z", r"DSA is deprecated")


def install_filters() -> None:
    """Ignore the known third-party warnings above (and only those). Idempotent: ``warnings`` keeps one copy of
    a filter added again."""
    try:
        from cryptography.utils import CryptographyDeprecationWarning
    except ImportError:  # an installation without cryptography cannot import asyncssh either
        return
    module, message = ASYNCSSH_DSA
    warnings.filterwarnings("ignore", message=message, category=CryptographyDeprecationWarning, module=module)


def capture_for_server() -> None:
    """Known warnings filtered, the others logged through ``py.warnings`` in the server's log format."""
    install_filters()
    logging.captureWarnings(True)
    log = logging.getLogger("py.warnings")  # (``corral server`` through the CLI: the CLI's choice undone)
    log.propagate = True
    log.handlers[:] = []


def capture_for_cli() -> None:
    """Known warnings filtered; the others logged, and shown on stderr only with ``CORRAL_DEBUG`` set."""
    install_filters()
    logging.captureWarnings(True)
    log = logging.getLogger("py.warnings")
    log.propagate = False
    log.handlers[:] = []
    if os.environ.get("CORRAL_DEBUG"):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        log.addHandler(handler)
    else:
        log.addHandler(logging.NullHandler())
