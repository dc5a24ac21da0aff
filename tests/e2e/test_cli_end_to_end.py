"""End to end as a user: `corral server` as a process, then `corral apply` of a fleet and a task with the
CLI, the task's output read back through `corral logs`, `corral ps`, `corral stop`, `corral fleet delete`."""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

FLEET = """type: fleet
name: e2e-fleet
nodes: 0..2
resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB..}
"""
TASK = """type: task
name: e2e-task
commands:
  - echo "marker from $DSTACK_RUN_NAME"
  - echo to-stderr >&2
resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB..}
"""
SLEEPER = """type: task
name: e2e-sleeper
commands: ["echo sleeping", "sleep 600"]
resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB..}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    port = _free_port()
    e = {
        **os.environ,
        "CORRAL_SERVER_DIR": str(tmp_path / "server"),
        "CORRAL_CONFIG_DIR": str(tmp_path / "cli"),
        "CORRAL_SAFETY_NET_INTERVAL": "60",
        "COLUMNS": "200",
        "CORRAL_TEST_PORT": str(port),
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "corral.cli.main", "server", "--port", str(port)],
        env=e,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthcheck", timeout=1)
            break
        except httpx.HTTPError:
            assert server.poll() is None, server.stdout.read() if server.stdout else ""
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.05)
    try:
        yield e
    finally:
        corral(e, "fleet", "delete", "e2e-fleet", "-y", check=False)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "e2e-fleet" in corral(e, "fleet", check=False).stdout:
            time.sleep(0.2)
        server.terminate()
        server.wait(20)


def corral(
    env: dict[str, str], *args: str, check: bool = True, cwd: Path | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [sys.executable, "-m", "corral.cli.main", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check:
        assert out.returncode == 0, f"corral {' '.join(args)} -> {out.returncode}\n{out.stdout}\n{out.stderr}"
    assert "Traceback" not in out.stderr, out.stderr
    return out


def test_fleet_task_logs_stop(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "fleet.dstack.yml").write_text(FLEET)
    (tmp_path / "task.dstack.yml").write_text(TASK)
    (tmp_path / "sleeper.dstack.yml").write_text(SLEEPER)
    # The server wrote the `main` project into the CLI config on first start.
    assert "main" in corral(env, "project", "list").stdout
    corral(env, "apply", "-f", str(tmp_path / "fleet.dstack.yml"), "-y")
    assert "e2e-fleet" in corral(env, "fleet").stdout
    # apply without -d follows the logs to the end and exits with the job's status.
    applied = corral(env, "apply", "-f", str(tmp_path / "task.dstack.yml"), "-y")
    assert "marker from e2e-task" in applied.stdout
    logs = corral(env, "logs", "e2e-task")
    assert "marker from e2e-task" in logs.stdout
    assert "e2e-task" in corral(env, "ps", "-a").stdout
    # A failing command makes `apply` exit non-zero.
    failing = tmp_path / "fail.dstack.yml"
    failing.write_text(TASK.replace("e2e-task", "e2e-fail").replace("echo to-stderr >&2", "exit 7"))
    assert corral(env, "apply", "-f", str(failing), "-y", check=False).returncode != 0
    # Detached run, then stop.
    corral(env, "apply", "-f", str(tmp_path / "sleeper.dstack.yml"), "-y", "-d")
    deadline = time.monotonic() + 30
    while "running" not in corral(env, "ps").stdout:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    corral(env, "stop", "e2e-sleeper", "-y")
    deadline = time.monotonic() + 30
    while True:
        row = next(line for line in corral(env, "ps", "-a").stdout.splitlines() if "e2e-sleeper" in line)
        if "stopped" in row:
            break
        assert time.monotonic() < deadline, row
        time.sleep(0.2)
    # Secrets: set from standard input (out of the shell's history), listed without values, used by a task
    # whose output masks them.
    secret = "cli-SECRET-value-5b7d"
    out = subprocess.run(
        [sys.executable, "-m", "corral.cli.main", "secret", "set", "api_key"],
        env=env,
        input=secret + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr
    listed = corral(env, "secret").stdout
    assert "api_key" in listed and "******" in listed and secret not in listed
    assert corral(env, "secret", "get", "api_key").stdout.strip() == secret
    user = tmp_path / "secret.dstack.yml"
    user.write_text(TASK.replace("e2e-task", "e2e-secret") + "env:\n  - KEY=${{ secrets.api_key }}\n")
    user.write_text(user.read_text().replace("echo to-stderr >&2", 'echo "key=$KEY"'))
    applied = corral(env, "apply", "-f", str(user), "-y")
    assert "key=******" in applied.stdout and secret not in applied.stdout
    corral(env, "secret", "delete", "api_key", "-y")
    assert "api_key" not in corral(env, "secret", "list").stdout
    missing = corral(env, "apply", "-f", str(user), "-y", check=False)
    assert missing.returncode == 1 and "missing vars: ['secrets.api_key']" in (missing.stdout + missing.stderr)
    assert corral(env, "secret", "get", "api_key", check=False).returncode == 1
    # `apply` with a broken file gives one readable line naming the field.
    bad = tmp_path / "bad.dstack.yml"
    bad.write_text("type: task\ncommands: [x]\nresources: {gpu: 'A100:lots'}\n")
    out = corral(env, "apply", "-f", str(bad), "-y", check=False)
    assert out.returncode == 1 and "resources.gpu" in (out.stdout + out.stderr)
    _events(env, tmp_path, failing)


def _events(env: dict[str, str], tmp_path: Path, failing: Path) -> None:
    """`corral event`: the session's events one a line as `dstack event` prints them; --within-run, --since
    and --watch; a bad --since is one line naming it."""
    lines = corral(env, "event").stdout.splitlines()
    assert any(line.endswith("[👤admin] [fleet e2e-fleet] Fleet created. Status: ACTIVE") for line in lines), lines
    stopped = (
        "[👤admin] [run e2e-sleeper] Run status changed RUNNING -> TERMINATING. Termination reason: STOPPED_BY_USER"
    )
    assert any(line.endswith(stopped) for line in lines), lines
    assert any("[job e2e-fail-0-0] Job status changed RUNNING -> FAILED" in line for line in lines), lines
    within = corral(env, "event", "--within-run", "e2e-task").stdout.splitlines()
    assert within and all("[run e2e-task]" in line or "job e2e-task-0-0" in line for line in within), within
    assert corral(env, "event", "--since", "1h").stdout.splitlines() == lines
    bad = corral(env, "event", "--since", "yesterday", check=False)
    assert bad.returncode == 1 and "--since 'yesterday'" in bad.stderr + bad.stdout
    watch = subprocess.Popen(
        [sys.executable, "-m", "corral.cli.main", "event", "--watch", "--since", "1s"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        corral(env, "apply", "-f", str(failing), "-y", "-d")  # a finished run of that name: deleted, submitted again
        assert watch.stdout is not None
        lines_out: queue.Queue[str] = queue.Queue()
        out = watch.stdout

        def pump() -> None:
            for x in out:
                lines_out.put(x)

        threading.Thread(target=pump, daemon=True).start()
        seen: list[str] = []
        deadline = time.monotonic() + 30
        while not any("[run e2e-fail] Run submitted. Status: SUBMITTED" in line for line in seen):
            assert time.monotonic() < deadline and watch.poll() is None, seen
            with contextlib.suppress(queue.Empty):
                seen.append(lines_out.get(timeout=1))
        assert any("[run e2e-fail] Run deleted" in line for line in seen), seen
    finally:
        watch.terminate()
        watch.wait(10)
