"""Ask the official dstack 0.22.5 client package (a separate virtualenv) how it parses configurations.

`dstack_verdicts(configs)` runs dstack's `parse_apply_configuration` on each config in one
subprocess and returns, per config, `{"ok": True, "dump": <model_dump(mode="json")>}` or
`{"ok": False, "error": "..."}`. Tests that use it skip only when that virtualenv is absent.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

DSTACK_PYTHON = Path("/work/.cache/dstack-client/bin/python")

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


def dstack_available() -> bool:
    return DSTACK_PYTHON.exists()


def dstack_verdicts(configs: list[Any]) -> list[dict[str, Any]]:
    if not dstack_available():
        pytest.skip(f"the dstack client virtualenv is absent ({DSTACK_PYTHON})")
    proc = subprocess.run(
        [str(DSTACK_PYTHON), "-c", _SCRIPT],
        input=json.dumps(configs),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result: list[dict[str, Any]] = json.loads(proc.stdout)
    return result
