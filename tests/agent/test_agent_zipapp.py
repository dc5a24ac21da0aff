"""The agent ships as a stdlib-only zipapp that runs under ``python3 -I`` (and Python 3.8 syntax)."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import corral.agent
from corral.agent.zipapp import build_zipapp
from old_python import OLDEST_PYTHON, find_python
from skip_policy import platform_skipif

AGENT_DIR = Path(corral.agent.__file__).parent


def _base_python() -> str:
    """An interpreter outside the dev virtualenv (no pydantic/httpx/corral installed)."""
    return str(getattr(sys, "_base_executable", None) or shutil.which("python3") or sys.executable)


def test_build_is_cached_by_content(tmp_path: Path) -> None:
    target = build_zipapp(tmp_path / "agent.pyz")
    mtime = target.stat().st_mtime_ns
    assert build_zipapp(target) == target and target.stat().st_mtime_ns == mtime
    target.write_bytes(b"garbage")
    build_zipapp(target)
    assert target.read_bytes().startswith(b"#!/usr/bin/env python3\n")


def test_zipapp_imports_only_the_standard_library(tmp_path: Path) -> None:
    pyz = build_zipapp(tmp_path / "agent.pyz")
    code = (
        "import sys, json; sys.path.insert(0, sys.argv[1]);"
        "import corral.agent.cli, corral.agent.server, corral.agent.jobs, corral.agent.resources,"
        " corral.agent.protocol, corral.agent.logstore, corral.agent.zipapp;"
        "std = sorted(getattr(sys, 'stdlib_module_names', []));"
        "print(json.dumps({'mods': sorted(sys.modules), 'stdlib': std, 'file': corral.agent.__file__}))"
    )
    out = subprocess.run(
        [_base_python(), "-I", "-S", "-c", code, str(pyz)], capture_output=True, check=True, timeout=30
    )
    data = json.loads(out.stdout)
    assert str(pyz) in data["file"], "corral.agent must come from the zipapp"
    mods = set(data["mods"])
    assert not {"pydantic", "httpx", "sqlalchemy", "fastapi", "yaml"} & mods
    assert {m for m in mods if m.startswith("corral")} <= {
        "corral",
        *(f"corral.agent{s}" for s in ("", ".cli", ".server", ".jobs", ".resources", ".protocol", ".logstore")),
        "corral.agent.procs",
        "corral.agent.workdir",
        "corral.agent.zipapp",
        *(f"corral.agent.{m}" for m in ("containers", "docker", "fields", "images", "protocol_containers")),
        *(f"corral.agent.{m}" for m in ("job", "portfwd", "protocol_sandbox", "sandbox", "sandbox_exec")),
        "corral.agent.launcher_server",
        "corral.agent.sandbox_spare",
        "corral.agent.latest_call",  # the bridge check a second after a job's end
        "corral.agent.sandbox_launch",
        "corral.agent.sandbox_slots",
        "corral.agent.sandbox_types",
        *(f"corral.agent.{m}" for m in ("sandbox_layout", "sandbox_net", "job_lifecycle", "gpus", "volumes")),
        "corral.agent.nvidia_csv",  # nvidia-smi's CSV, read by gpus and metrics
        "corral.agent.protocol_session",
        "corral.agent.container_sessions",
        "corral.agent.metrics",  # the sampler of running jobs
        "corral.agent.protocol_metrics",
        "corral.agent.netlink",  # a job's network namespace, made over rtnetlink
        "corral.agent.slot_owner",  # which agent process holds a sandbox slot
        "corral.agent.privileged",  # whether the host's Docker can start privileged containers
        "corral.agent.http_head",  # a request's head read without the email package
    }
    if data["stdlib"]:
        stdlib = set(data["stdlib"])
        foreign = {m.split(".")[0] for m in mods} - stdlib - {"corral", "__main__"}
        assert not foreign, foreign


def test_agent_sources_parse_as_python_38() -> None:
    for path in AGENT_DIR.glob("*.py"):
        source = path.read_text()
        ast.parse(source, filename=str(path), feature_version=(3, 8))
        assert "from __future__ import annotations" in source or path.name == "__init__.py", path


def test_zipapp_runs_a_job_under_isolated_python(agent_factory: Any, tmp_path: Path) -> None:
    pyz = build_zipapp(tmp_path / "agent.pyz")
    a = agent_factory("pyz", argv=[_base_python(), "-I", str(pyz)])
    a.submit("z", ["echo from-zipapp"])
    assert a.wait_finished("z")["state"] == "done"
    assert a.output("z") == b"from-zipapp\n"


_OLD_PYTHON = find_python(OLDEST_PYTHON)


@platform_skipif(_OLD_PYTHON is None, f"no Python {OLDEST_PYTHON} interpreter here (Debian 12 ships only 3.11)")
def test_zipapp_runs_under_the_oldest_supported_python(agent_factory: Any, tmp_path: Path) -> None:
    assert _OLD_PYTHON is not None
    pyz = build_zipapp(tmp_path / "agent.pyz")
    a = agent_factory("pyz-old", argv=[_OLD_PYTHON, "-I", str(pyz)])
    assert a.http.get("/info").json()["python_version"].startswith(OLDEST_PYTHON)
    a.submit("z", [f"echo {OLDEST_PYTHON}"])
    assert a.wait_finished("z")["exit_status"] == 0
