"""Ask the official dstack 0.22.5 client package (a separate virtualenv) how it parses configurations.

`dstack_verdicts(configs)` runs dstack's `parse_apply_configuration` on each config in one
subprocess and returns, per config, `{"ok": True, "dump": <model_dump(mode="json")>}` or
`{"ok": False, "error": "..."}`. The virtualenv is the end-to-end tests' (``tests/e2e/dstack_client_env.py``:
``$CORRAL_DSTACK_CLIENT_VENV``, else built once in a cache); a test that cannot get it fails saying why.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from dstack_client_env import DSTACK_VERSION, ClientInstallError, client_venv

_SCRIPT = r"""
import json, sys
from dstack._internal.core.models.configurations import parse_apply_configuration
out = []
for conf in json.load(sys.stdin):
    try:
        out.append({"ok": True, "dump": parse_apply_configuration(conf).model_dump(mode="json")})
    except Exception as e:
        out.append({"ok": False, "error": f"{type(e).__name__}: {e}"[:500]})
json.dump(out, sys.stdout)
"""


def dstack_python() -> Path:
    try:
        return client_venv() / "bin" / "python"
    except ClientInstallError as e:
        pytest.fail(f"could not install dstack=={DSTACK_VERSION} to compare with:\n{e}", pytrace=False)


def dstack_verdicts(configs: list[Any]) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [str(dstack_python()), "-c", _SCRIPT],
        input=json.dumps(configs),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result: list[dict[str, Any]] = json.loads(proc.stdout)
    return result
