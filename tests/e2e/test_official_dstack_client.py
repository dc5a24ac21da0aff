"""The official dstack 0.22.5 CLI, unchanged, against a real ``corral server`` subprocess.

What a user does: add the project, look at fleets, apply a fleet, apply tasks detached, follow them with
``ps``, read ``logs``, ``stop`` one, list ``offer``s, delete the fleet. Every step checks the exit code
and what the CLI printed (the client validates every response with its own pydantic models, so a field
or enum value it does not know fails the command).

The tests of this module run in order and build on each other (module-scoped fixtures hold the server,
the project, the fleet and the finished task).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from dstack_client_env import (
    CorralServer,
    DstackCli,
    agent_pids_under,
    cli_env,
    corral_server,
)

TOKEN = "e2e-admin-token-0123456789"
MARKER = "CORRAL-E2E-MARKER-7f3a"
RESOURCES = "resources:\n  cpu: 1..\n  memory: 0.1GB..\n  disk: 1GB..\n"
FINISHED = ("done", "failed", "terminated")


@pytest.fixture(scope="module")
def e2e_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dstack-e2e")


@pytest.fixture(scope="module")
def server(e2e_tmp: Path) -> Iterator[CorralServer]:
    # samples every half second, brought on polls of at most 2 s: `dstack metrics` has some soon
    with corral_server(e2e_tmp, TOKEN, CORRAL_AGENT_METRICS_INTERVAL="0.5", CORRAL_AGENT_POLL_WAIT="2") as s:
        yield s


@pytest.fixture(scope="module")
def cli(dstack_venv: Path, server: CorralServer, e2e_tmp: Path) -> DstackCli:
    home = e2e_tmp / "home"
    workdir = e2e_tmp / "work"  # empty, not a git repo: the CLI uses a virtual repo
    home.mkdir()
    workdir.mkdir()
    return DstackCli(dstack_venv, home, workdir, server)


@pytest.fixture(scope="module")
def project(cli: DstackCli) -> str:
    res = cli.ok("project", "add", "--name", "main", "--url", cli.server.url, "--token", TOKEN, "-y")
    assert "Configuration updated at" in res.output, cli.explain(res)
    return res.output


def rows(output: str, first: str) -> list[str]:
    """Table lines whose first cell is ``first``."""
    return [line for line in output.splitlines() if line.split()[:1] == [first]]


def runs_json(cli: DstackCli) -> dict[str, dict[str, Any]]:
    res = cli.ok("ps", "-a", "--json")
    data = json.loads(res.stdout)
    assert data["project"] == "main", res.stdout
    return {r["run_spec"]["run_name"]: r for r in data["runs"]}


def wait_run(cli: DstackCli, name: str, statuses: tuple[str, ...], timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    run = None
    while time.monotonic() < deadline:
        run = runs_json(cli).get(name)
        if run is not None and run["status"] in statuses:
            return run
        time.sleep(0.5)
    status = run and (run["status"], run["latest_job_submission"])
    raise AssertionError(f"run {name} not in {statuses} within {timeout}s (last: {status})\n{cli.server.log_tail()}")


@pytest.fixture(scope="module")
def fleet(cli: DstackCli, project: str) -> str:
    cli.write("fleet.dstack.yml", f"type: fleet\nname: e2e-fleet\nnodes: 0..2\n{RESOURCES}")
    res = cli.ok("apply", "-f", "fleet.dstack.yml", "-y")
    out = res.output
    assert re.search(r"Resources\s+cpu=1\.\. mem=0\.1GB\.\. disk=1GB\.\.", out), cli.explain(res)
    assert re.search(r"Nodes\s+min=0 target=0 max=2", out), cli.explain(res)
    # The plan lists corral's local offer (on the wire as backend `remote`, which dstack's CLI shows as ssh).
    assert any("ssh" in line and "$0" in line for line in rows(out, "1")), cli.explain(res)
    assert "Fleet e2e-fleet does not exist yet" in out, cli.explain(res)
    return "e2e-fleet"


@pytest.fixture(scope="module")
def finished_task(cli: DstackCli, fleet: str) -> dict[str, Any]:
    cli.write(
        "task.dstack.yml",
        "type: task\nname: e2e-task\ncommands:\n"
        f"  - echo {MARKER}\n"
        '  - echo "run=$DSTACK_RUN_NAME nodes=$DSTACK_NODES_NUM"\n'
        f"{RESOURCES}",
    )
    res = cli.ok("apply", "-f", "task.dstack.yml", "-y", "-d")
    assert "Run e2e-task submitted, detaching" in res.output, cli.explain(res)
    assert re.search(r"Type\s+task \(nodes=1\)", res.output), cli.explain(res)
    return wait_run(cli, "e2e-task", FINISHED)


def test_project_add_and_list(cli: DstackCli, project: str) -> None:
    config = yaml.safe_load((cli.home / ".dstack" / "config.yml").read_text())
    (entry,) = config["projects"]
    assert entry["name"] == "main"
    assert entry["url"] == cli.server.url
    assert entry["token"] == TOKEN
    res = cli.ok("project", "list")
    (row,) = rows(res.stdout, "main")
    assert cli.server.url in row and "✓" in row, cli.explain(res)
    assert rows(res.stdout, "PROJECT"), cli.explain(res)


def test_fleet_list_empty(cli: DstackCli, project: str) -> None:
    res = cli.ok("fleet")
    lines = [line for line in res.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, cli.explain(res)
    assert lines[0].split() == ["NAME", "NODES", "GPU", "SPOT", "BACKEND", "PRICE", "STATUS", "CREATED"]


def test_apply_fleet_then_list(cli: DstackCli, fleet: str) -> None:
    res = cli.ok("fleet")
    (row,) = rows(res.stdout, fleet)
    assert "0..2" in row and "active" in row, cli.explain(res)
    res = cli.ok("apply", "-f", "fleet.dstack.yml", "-y")  # unchanged: the plan says there is nothing to do
    assert "No configuration changes detected" in res.output, cli.explain(res)


def test_task_runs_to_done_and_logs(cli: DstackCli, finished_task: dict[str, Any]) -> None:
    run = finished_task
    sub = run["latest_job_submission"]
    assert run["status"] == "done", (run["status"], run["termination_reason"], sub)
    assert run["termination_reason"] == "all_jobs_done"
    assert sub["status"] == "done" and sub["exit_status"] == 0, sub
    assert run["fleet"]["name"] == "e2e-fleet"
    res = cli.ok("ps", "-a")
    (row,) = rows(res.stdout, "e2e-task")
    assert "exited (0)" in row, cli.explain(res)
    res = cli.ok("logs", "e2e-task")
    assert MARKER in res.stdout, cli.explain(res)
    assert "run=e2e-task nodes=1" in res.stdout, cli.explain(res)


def test_stop_long_task(cli: DstackCli, finished_task: dict[str, Any]) -> None:
    cli.write("long.dstack.yml", f"type: task\nname: e2e-long\ncommands:\n  - sleep 600\n{RESOURCES}")
    res = cli.ok("apply", "-f", "long.dstack.yml", "-y", "-d")
    assert "Run e2e-long submitted, detaching" in res.output, cli.explain(res)
    wait_run(cli, "e2e-long", ("running",))
    running = _metrics_shown(cli, "e2e-long")
    res = cli.ok("stop", "e2e-long", "-y")
    assert "Stopped" in res.output, cli.explain(res)
    run = wait_run(cli, "e2e-long", FINISHED, timeout=60)
    assert run["status"] == "terminated", run["status"]
    assert run["termination_reason"] == "stopped_by_user"
    assert run["latest_job_submission"]["termination_reason"] == "terminated_by_user"

    res = cli.ok("ps", "-a")
    (long_row,) = rows(res.stdout, "e2e-long")
    (task_row,) = rows(res.stdout, "e2e-task")
    assert "stopped" in long_row, cli.explain(res)
    assert "exited (0)" in task_row, cli.explain(res)
    res = cli.ok("ps", "-a", "-v")
    assert rows(res.stdout, "e2e-long") and rows(res.stdout, "e2e-task"), cli.explain(res)
    finished = _metrics_shown(cli, "e2e-long")  # a finished run keeps its samples
    assert finished.splitlines()[0] == running.splitlines()[0]


def _metrics_shown(cli: DstackCli, run: str, timeout: float = 30) -> str:
    """``dstack metrics RUN`` once it draws the job's CPU and memory (not "no data"): its output."""
    deadline = time.monotonic() + timeout
    while True:
        res = cli.ok("metrics", run)
        (cpu,) = [line for line in res.stdout.splitlines() if line.split()[:2] == ["job=0", "cpu"]]
        if re.search(r"\d+%", cpu) and re.search(r"\d+(\.\d+)?[KMG]?B/\d", cpu):
            assert "UTILIZATION" in res.stdout and "MEMORY" in res.stdout, cli.explain(res)
            return str(res.stdout)
        assert time.monotonic() < deadline, cli.explain(res)
        time.sleep(1)


def test_event(cli: DstackCli, finished_task: dict[str, Any]) -> None:
    """``dstack event``: the last events of the project, oldest first, one a line; its filters resolve names
    through ``runs/get`` and ``fleets/get``; ``--since`` pages ascending."""
    res = cli.ok("event")
    lines = res.stdout.splitlines()
    assert any(line.endswith("[👤admin] [fleet e2e-fleet] Fleet created. Status: ACTIVE") for line in lines), lines
    assert any(line.endswith("[👤admin] [run e2e-task] Run submitted. Status: SUBMITTED") for line in lines), lines
    stop = "[👤admin] [run e2e-long] Run status changed RUNNING -> TERMINATING. Termination reason: STOPPED_BY_USER"
    assert any(line.endswith(stop) for line in lines), lines
    assert any("[job e2e-task-0-0] Job status changed RUNNING -> DONE" in line for line in lines), lines
    within = cli.ok("event", "--within-run", "e2e-long").stdout.splitlines()
    assert within and all("[run e2e-long]" in line or "job e2e-long-0-0" in line for line in within), within
    fleet = cli.ok("event", "--target-fleet", "e2e-fleet").stdout.splitlines()
    assert fleet and all("[fleet e2e-fleet]" in line for line in fleet), fleet
    jobs = cli.ok("event", "--within-run", "e2e-task", "--include-target-type", "job").stdout.splitlines()
    assert jobs and all("job e2e-task-0-0" in line for line in jobs), jobs
    assert cli.ok("event", "--since", "1h").stdout.splitlines() == lines


def test_offer(cli: DstackCli, project: str) -> None:
    res = cli.ok("offer")
    offers = rows(res.stdout, "1")
    assert len(offers) == 1 and "ssh" in offers[0] and "$0" in offers[0], cli.explain(res)
    assert not rows(res.stdout, "2"), cli.explain(res)
    res = cli.ok("offer", "--json")
    data = json.loads(res.stdout)
    assert data["project"] == "main" and data["user"] == "admin", res.stdout
    assert data["total_offers"] == 1 and len(data["offers"]) == 1, res.stdout
    (offer,) = data["offers"]
    assert offer["backend"] == "remote"
    assert offer["availability"] == "available"
    assert offer["instance"]["resources"]["cpus"] >= 1


SECRET_VALUE = "e2e-SECRET-value-41c9"


def test_secrets_and_a_task_that_uses_one(cli: DstackCli, fleet: str) -> None:
    res = cli.ok("secret", "set", "e2e-token", SECRET_VALUE)
    assert "OK" in res.output, cli.explain(res)
    res = cli.ok("secret")
    (row,) = rows(res.stdout, "e2e-token")
    assert "******" in row and SECRET_VALUE not in res.stdout, cli.explain(res)
    res = cli.ok("secret", "get", "e2e-token")
    assert SECRET_VALUE in res.stdout, cli.explain(res)
    cli.write(
        "secret.dstack.yml",
        "type: task\nname: e2e-secret\nenv:\n  - TOKEN=${{ secrets.e2e_token }}\ncommands:\n"
        '  - echo "$TOKEN" | rev\n  - echo "token=$TOKEN"\n'
        f"{RESOURCES}",
    )
    res = cli.run("apply", "-f", "secret.dstack.yml", "-y", "-d")  # `e2e-token` is no reference name
    assert res.returncode != 0 and "secrets.e2e_token" in res.output, cli.explain(res)
    cli.ok("secret", "set", "e2e_token", SECRET_VALUE)
    res = cli.ok("apply", "-f", "secret.dstack.yml", "-y", "-d")
    run = wait_run(cli, "e2e-secret", FINISHED)
    assert run["status"] == "done", run["latest_job_submission"]
    assert run["run_spec"]["configuration"]["env"]["TOKEN"] == "${{ secrets.e2e_token }}"
    res = cli.ok("logs", "e2e-secret")
    assert SECRET_VALUE[::-1] in res.stdout and "token=******" in res.stdout, cli.explain(res)
    assert SECRET_VALUE not in res.stdout, cli.explain(res)
    res = cli.ok("secret", "delete", "e2e-token", "-y")
    cli.ok("secret", "delete", "e2e_token", "-y")
    res = cli.ok("secret")
    assert not rows(res.stdout, "e2e-token") and not rows(res.stdout, "e2e_token"), cli.explain(res)


def test_login_finds_no_sso_provider(cli: DstackCli, project: str) -> None:
    # `dstack login` asks auth/list_providers first: corral, like dstack's open-source server, has none
    res = cli.run("login", "--url", cli.server.url)
    assert res.returncode != 0 and "No SSO providers configured on the server." in res.output, cli.explain(res)


#: The official client's view of a deleted fleet read by id (its ``APIClient.fleets.get`` parses dstack's ``Fleet``).
FLEET_BY_ID = """
import sys, uuid
from dstack.api.server import APIClient
fleet = APIClient(sys.argv[1], sys.argv[2]).fleets.get("main", fleet_id=uuid.UUID(sys.argv[3]))
print("fleet", fleet.status.value, len(fleet.instances))
"""


def test_fleet_delete(cli: DstackCli, fleet: str, e2e_tmp: Path) -> None:
    fleet_id = cli.server.api("/api/project/main/fleets/get", {"name": fleet}).json()["id"]
    instance_ids = [i["id"] for i in cli.server.api("/api/instances/list", {}).json() if i["fleet_name"] == fleet]
    assert instance_ids, "the task ran on an instance of the fleet"
    res = cli.ok("fleet", "delete", fleet, "-y")
    assert f"Fleet {fleet} deleted" in res.output, cli.explain(res)
    # The safety net runs every 60 s: the fleet must go away on wake-ups alone.
    deadline = time.monotonic() + 20
    while True:
        res = cli.ok("fleet")
        if not rows(res.stdout, fleet):
            break
        assert time.monotonic() < deadline, cli.explain(res)
        time.sleep(0.5)
    deadline = time.monotonic() + 20
    while agent_pids_under(e2e_tmp):
        assert time.monotonic() < deadline, "the fleet's local agent is still running"
        time.sleep(0.2)
    # its instances are terminated and deleted, as dstack's: the deleted fleet read by id holds none of them (dstack
    # loads a fleet's instances not deleted), and instances/list still lists them, terminated
    script = e2e_tmp / "fleet_by_id.py"
    script.write_text(FLEET_BY_ID)
    proc = subprocess.run(
        [str(cli.venv / "bin" / "python"), str(script), cli.server.url, TOKEN, fleet_id],
        capture_output=True, text=True, timeout=60, env=cli_env(cli.home), cwd=cli.workdir, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0 and "fleet terminated 0" in proc.stdout, proc.stdout + proc.stderr
    listed = {i["id"]: i["status"] for i in cli.server.api("/api/instances/list", {}).json()}
    assert all(listed[i] == "terminated" for i in instance_ids), listed


def test_server_log_has_no_errors(cli: DstackCli) -> None:
    log = cli.server.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "ERROR" not in log, cli.server.log_tail(200)
