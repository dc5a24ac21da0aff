"""`corral --help` must stay fast: importing the CLI pulls in nothing heavy."""

from __future__ import annotations

import json
import subprocess
import sys
import time

HEAVY = ("rich", "httpx", "yaml", "pydantic", "pydantic_core", "corral.config", "corral.sdk.client")


def test_cli_import_pulls_in_nothing_heavy() -> None:
    code = "import sys, json, corral.cli.main; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out))
    heavy = sorted(m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert heavy == []


def test_help_loads_nothing_heavy_and_is_fast() -> None:
    code = (
        "import sys, json\n"
        "from corral.cli.main import run\n"
        "rc = run(['--help'])\n"
        "sys.stderr.write(json.dumps(sorted(sys.modules)))\n"
        "sys.exit(rc)\n"
    )
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        best = min(best, time.perf_counter() - start)
        assert proc.returncode == 0, proc.stderr
        assert "Commands" in proc.stdout and "apply" in proc.stdout
    loaded = set(json.loads(proc.stderr))
    assert not [m for m in loaded if m.split(".")[0] in ("rich", "httpx", "yaml", "pydantic")]
    # about 0.1 s on the project's machine; generous for loaded CI hosts
    assert best < 1.0, f"corral --help took {best:.2f}s"
