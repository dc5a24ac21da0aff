"""Python warnings in corral's processes: the server logs them in its own format (one JSON object a line with
``CORRAL_LOG_FORMAT=json``), the CLI keeps them out of its output unless ``CORRAL_DEBUG`` is set, and the known
harmless one (asyncssh reading cryptography's deprecated DSA types at import) is filtered by its exact module and
category, never by a blanket rule. Each case runs in a fresh interpreter with every warning on (``-W default``),
so the import-time warnings really fire and this process's warning state stays untouched."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-W", "default", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", **env},
    )


def test_asyncssh_warns_at_import_without_the_filter() -> None:
    """The premise: the cryptography in the lock does warn when asyncssh is imported (if this fails, the filter
    below is no longer needed and can go)."""
    proc = _python("import asyncssh")
    assert "CryptographyDeprecationWarning" in proc.stderr and "DSA" in proc.stderr, proc.stderr


def test_the_server_log_stays_json_and_other_warnings_become_records() -> None:
    proc = _python(
        "import sys, warnings\n"
        "from corral import server_logs\n"
        "server_logs.configure('info', 'json', sys.stderr)\n"
        "import asyncssh\n"
        "warnings.warn('a library changed its mind', FutureWarning)\n"
    )
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stderr.splitlines()]  # every line is one JSON object
    assert len(records) == 1, records  # the DSA notices are gone, the other warning is kept
    assert records[0]["logger"] == "py.warnings" and records[0]["level"] == "warning"
    assert "FutureWarning: a library changed its mind" in records[0]["message"]


def test_only_the_known_warning_is_filtered() -> None:
    """The same category from another module, or another message from asyncssh's module, still comes through."""
    proc = _python(
        "import sys, warnings\n"
        "from cryptography.utils import CryptographyDeprecationWarning as W\n"
        "from corral import server_logs\n"
        "server_logs.configure('info', 'json', sys.stderr)\n"
        "warnings.warn_explicit('DSA is deprecated', W, 'x.py', 1, module='some.other.module')\n"
        "warnings.warn_explicit('something else', W, 'misc.py', 1, module='asyncssh.crypto.misc')\n"
        "warnings.warn_explicit('DSA is deprecated', W, 'misc.py', 1, module='asyncssh.crypto.misc')\n"
    )
    assert proc.returncode == 0, proc.stderr
    messages = [json.loads(line)["message"] for line in proc.stderr.splitlines()]
    assert len(messages) == 2, messages
    assert "DSA is deprecated" in messages[0] and "something else" in messages[1]


@pytest.mark.parametrize("debug", [False, True])
def test_the_cli_prints_no_dependency_warning_unless_debugging(debug: bool) -> None:
    env = {"CORRAL_DEBUG": "1"} if debug else {}
    proc = _python(
        "import warnings\n"
        "from corral import known_warnings\n"
        "known_warnings.capture_for_cli()\n"
        "import asyncssh\n"
        "warnings.warn('a library changed its mind', FutureWarning)\n"
        "print('job output')\n",
        **env,
    )
    assert proc.returncode == 0 and proc.stdout == "job output\n", proc.stderr
    assert "DSA" not in proc.stderr  # the known one: never, not even when debugging
    assert ("a library changed its mind" in proc.stderr) is debug, proc.stderr
