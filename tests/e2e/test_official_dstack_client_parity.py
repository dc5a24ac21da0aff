"""The official dstack 0.22.5 CLI against ``corral server``: steps dstack users take that corral once refused
or answered empty.

* ``dstack logs -d RUN``: the diagnostic log (dstack's runner log), here the agent's own lines about the job;
* ``dstack apply --idle-duration 1m --max-price ... --retry-duration ...``: a run's ``idle_duration`` is
  accepted and set on the instance created for it;
* a task with instance volumes (``/host/path:/path``, ``optional``) and no ``image``: it reads a file of
  the host through its mount.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dstack_client_env import CorralServer, DstackCli, corral_server

TOKEN = "e2e-parity-token-0123456789"
RESOURCES = "resources:\n  cpu: 1..\n  memory: 0.1GB..\n  disk: 1GB..\n"
FINISHED = ("done", "failed", "terminated")


@pytest.fixture(scope="module")
def e2e_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dstack-parity")


@pytest.fixture(scope="module")
def server(e2e_tmp: Path) -> Iterator[CorralServer]:
    with corral_server(e2e_tmp, TOKEN, CORRAL_AGENT_POLL_WAIT="2") as s:
        yield s


@pytest.fixture(scope="module")
def cli(dstack_venv: Path, server: CorralServer, e2e_tmp: Path) -> DstackCli:
    (e2e_tmp / "home").mkdir()
    (e2e_tmp / "work").mkdir()
    c = DstackCli(dstack_venv, e2e_tmp / "home", e2e_tmp / "work", server)
    c.ok("project", "add", "--name", "main", "--url", server.url, "--token", TOKEN, "-y")
    c.write("fleet.dstack.yml", f"type: fleet\nname: parity\nnodes: 0..2\n{RESOURCES}")
    c.ok("apply", "-f", "fleet.dstack.yml", "-y")
    return c


def wait_run(cli: DstackCli, name: str, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        runs = {r["run_spec"]["run_name"]: r for r in json.loads(cli.ok("ps", "-a", "--json").stdout)["runs"]}
        run = runs.get(name)
        if run is not None and run["status"] in FINISHED:
            return dict(run)
        assert time.monotonic() < deadline, f"{name} did not finish: {run and run['status']}\n{cli.server.log_tail()}"
        time.sleep(0.5)


def test_logs_diagnose_shows_the_agent_s_lines_about_the_job(cli: DstackCli) -> None:
    cli.write("diag.dstack.yml", f"type: task\nname: diag\ncommands:\n  - echo job-output\n  - exit 3\n{RESOURCES}")
    cli.ok("apply", "-f", "diag.dstack.yml", "-y", "-d")
    run = wait_run(cli, "diag")
    assert run["status"] == "failed", run["latest_job_submission"]
    res = cli.ok("logs", "-d", "diag")
    assert "Job diag (" in res.stdout and "received: a host process" in res.stdout, cli.explain(res)
    assert "Process started (pid " in res.stdout, cli.explain(res)
    assert "Exited with status 3: failed" in res.stdout, cli.explain(res)
    assert "job-output" not in res.stdout, cli.explain(res)
    res = cli.ok("logs", "diag")  # the job's own output has none of the agent's lines
    assert "job-output" in res.stdout and "Process started" not in res.stdout, cli.explain(res)


def _instance_idle(server: CorralServer) -> dict[str, float | None]:
    """Each instance's idle duration, as the server stored it (its SQLite database, read-only)."""
    db = sqlite3.connect(f"file:{server.server_dir / 'data' / 'corral.db'}?mode=ro", uri=True)
    try:
        return dict(db.execute("SELECT name, idle_duration FROM instances WHERE status != 'terminated'").fetchall())
    finally:
        db.close()


def test_apply_with_idle_duration_sets_it_on_the_instance_created_for_the_run(cli: DstackCli) -> None:
    # a fleet of its own: an instance the run reuses keeps the idle duration it was created with (as dstack's)
    cli.write("idlefl.dstack.yml", f"type: fleet\nname: idlefl\nnodes: 0..1\n{RESOURCES}")
    cli.ok("apply", "-f", "idlefl.dstack.yml", "-y")
    cli.write("idle.dstack.yml", f"type: task\nname: idle\nfleets: [idlefl]\ncommands:\n  - 'true'\n{RESOURCES}")
    args = ("--idle-duration", "1m", "--max-price", "1", "--retry-duration", "10m")
    res = cli.ok("apply", "-f", "idle.dstack.yml", *args, "-y", "-d")
    assert "Run idle submitted" in res.output, cli.explain(res)
    run = wait_run(cli, "idle")
    assert run["status"] == "done", run["latest_job_submission"]
    assert run["run_spec"]["configuration"]["idle_duration"] == 60, run["run_spec"]["configuration"]
    assert _instance_idle(cli.server)["idlefl-0"] == 60.0  # the fleet sets none: the run's


def test_instance_volume_without_image_is_mounted(cli: DstackCli, e2e_tmp: Path) -> None:
    host = e2e_tmp / "host-data"
    host.mkdir()
    (host / "input.txt").write_text("from-the-host\n")
    missing = e2e_tmp / "not-there"
    cli.write(
        "vol.dstack.yml",
        "type: task\nname: vol\ncommands:\n  - cat /data/input.txt\n  - test ! -e /maybe/x && echo optional-left-out\n"
        f"volumes:\n  - {host}:/data\n  - instance_path: {missing}\n    path: /maybe\n    optional: true\n"
        f"{RESOURCES}",
    )
    res = cli.ok("apply", "-f", "vol.dstack.yml", "-y", "-d")
    run = wait_run(cli, "vol")
    assert run["status"] == "done", (run["latest_job_submission"], cli.ok("logs", "-d", "vol").stdout)
    res = cli.ok("logs", "vol")
    assert "from-the-host" in res.stdout and "optional-left-out" in res.stdout, cli.explain(res)
    res = cli.ok("logs", "-d", "vol")
    assert f"Instance volume {host} mounted at /data" in res.stdout, cli.explain(res)
    assert f"Instance volume {missing} not mounted at /maybe" in res.stdout, cli.explain(res)
