"""The official dstack 0.22.5 CLI attached to runs over corral's SSH endpoint (``corral.sshd``): an
attached ``dstack apply`` of a short task prints its output and exits 0 (``/logs_ws`` through the tunnel);
``dstack attach`` of a running task writes the ``Host`` entries, after which plain OpenSSH through them
runs commands with their exit status, in the job's sandbox, and ``scp``/``sftp`` round-trip files; a
wrong key and another user's key are refused; ``dstack stop`` closes the endpoint. Dev environments print
the IDE link, forward their ``ports`` through ``dstack attach`` and end after ``inactivity_duration``.

Runs as root (the jobs run in their sandboxes) with OpenSSH's client (``scripts/test.sh`` installs it).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from dstack_client_env import (
    CorralServer,
    DstackCli,
    _corral_command,
    cli_env,
    corral_server,
    free_port,
    short_home,
)
from test_official_dstack_client import RESOURCES

TOKEN = "e2e-attach-admin-token-0123456789"
#: Chosen afresh per run: the CLI binds its local forward without SO_REUSEADDR, so a port whose forwarded
#: connection of a previous run sits in TIME_WAIT would be refused for a minute.
APP_PORT = free_port()


@pytest.fixture(scope="module")
def e2e_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    for tool in ("ssh", "scp", "sftp", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.fail(f"`{tool}` is missing: install openssh-client (scripts/test.sh does)")
    if os.geteuid() != 0:
        pytest.fail("the attach tests need root (jobs in their sandboxes); CI runs them as root")
    return tmp_path_factory.mktemp("dstack-attach")


@pytest.fixture(scope="module")
def server(e2e_tmp: Path) -> Iterator[CorralServer]:
    with corral_server(e2e_tmp, TOKEN) as s:
        yield s


@pytest.fixture(scope="module")
def cli(dstack_venv: Path, server: CorralServer, e2e_tmp: Path) -> Iterator[DstackCli]:
    workdir = e2e_tmp / "work"
    workdir.mkdir()
    with short_home() as home:
        c = DstackCli(dstack_venv, home, workdir, server)
        c.ok("project", "add", "--name", "main", "--url", server.url, "--token", TOKEN, "-y")
        c.write("fleet.dstack.yml", f"type: fleet\nname: attach-fleet\nnodes: 0..2\n{RESOURCES}")
        c.ok("apply", "-f", "fleet.dstack.yml", "-y")
        yield c


def _ssh(cli: DstackCli, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Plain OpenSSH through the entries the CLI wrote (``-F``: the passwd home's config is not ours)."""
    return subprocess.run(
        ["ssh", "-F", str(cli.home / ".ssh" / "config"), "-o", "BatchMode=yes", *args],
        capture_output=True, text=True, timeout=timeout, env=cli_env(cli.home), stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _run(server: CorralServer, name: str) -> dict[str, Any]:
    return dict(server.api("/api/project/main/runs/get", {"run_name": name}).json())


def test_attached_apply_of_a_short_task_prints_its_output(cli: DstackCli) -> None:
    cli.write(
        "short.dstack.yml",
        f"type: task\nname: short\ncommands:\n  - echo attached-hello-1\n  - echo bye-2\n{RESOURCES}",
    )
    started = time.monotonic()
    res = cli.run("apply", "-f", "short.dstack.yml", "-y", timeout=150)
    assert res.returncode == 0, cli.explain(res)
    out = res.stdout
    assert "attached-hello-1" in out and "bye-2" in out, cli.explain(res)
    assert out.index("attached-hello-1") < out.index("bye-2")
    assert time.monotonic() - started < 60, "the attached client waited for the 30 s 'Lost run connection'"
    sub = _run(cli.server, "short")["jobs"][0]["job_submissions"][-1]
    jpd = sub["job_provisioning_data"]
    assert jpd["ssh_port"] and jpd["dockerized"] is True and jpd["username"] == sub["id"], jpd


DEV = f"""type: dev-environment
name: longer
ide: vscode
ports: ["{APP_PORT}"]
init:
  - echo served-by-the-job > index.html
  - python3 -m http.server {APP_PORT} > /dev/null 2>&1 &
{RESOURCES}"""


@pytest.fixture(scope="module")
def attached(cli: DstackCli) -> Iterator[subprocess.Popen[str]]:
    """``dstack attach`` of a running dev environment, kept attached for the tests that follow."""
    cli.write("dev.dstack.yml", DEV)
    cli.ok("apply", "-f", "dev.dstack.yml", "-y", "-d")
    deadline = time.monotonic() + 60
    while _run(cli.server, "longer")["status"] != "running":
        assert time.monotonic() < deadline, _run(cli.server, "longer")
        time.sleep(0.3)
    proc = subprocess.Popen(
        [str(cli.venv / "bin" / "dstack"), "attach", "longer"], cwd=cli.workdir, env=cli_env(cli.home),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None
    lines = []
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        lines.append(line)
        if "Press Ctrl+C to detach" in line or time.monotonic() > deadline:
            break
    out = "".join(lines)
    assert "Attached to run longer" in out and f"localhost:{APP_PORT} -> {APP_PORT}" in out, out
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl+C: the CLI detaches (its tunnel goes with it)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_dev_environment_prints_the_ide_link_and_forwards_its_port(cli: DstackCli, attached: Any) -> None:
    job = _run(cli.server, "longer")["jobs"][0]
    info = job["job_connection_info"]
    assert info["ide_name"] == "VS Code" and info["attached_ssh_command"] == ["ssh", "longer"], info
    assert info["attached_ide_url"] == "vscode://vscode-remote/ssh-remote+longer/workflow", info
    deadline = time.monotonic() + 30
    while "vscode://vscode-remote/ssh-remote+longer/workflow" not in (logs := cli.ok("logs", "longer").output):
        assert time.monotonic() < deadline, logs
        time.sleep(0.5)
    assert "To connect via SSH, use: `ssh longer`" in logs, logs
    while True:  # the job's server on its port, on localhost through the attach tunnel
        try:
            body = httpx.get(f"http://localhost:{APP_PORT}/index.html", timeout=5).text
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "nothing answers on the forwarded port"
            time.sleep(0.3)
    assert body.strip() == "served-by-the-job"


def test_ssh_runs_commands_in_the_job_with_their_exit_status(cli: DstackCli, attached: Any) -> None:
    config = (cli.home / ".dstack" / "ssh" / "config").read_text()
    assert "Host longer-host" in config and "ProxyJump longer-host" in config, config
    res = _ssh(cli, "longer", 'echo "run=$DSTACK_RUN_NAME"; id -u; pwd; exit 7')
    assert res.returncode == 7, res.stderr
    assert res.stdout.split() == ["run=longer", "0", "/workflow"], (
        "the job's env, its user (root of its own user namespace), its dir"
    )
    tty = _ssh(cli, "-tt", "longer", "stty size; tty; exit 3")
    assert tty.returncode == 3, tty.stdout + tty.stderr
    assert "24 80" in tty.stdout and "/dev/pts/" in tty.stdout, tty.stdout


def test_scp_and_sftp_round_trip(cli: DstackCli, attached: Any, e2e_tmp: Path) -> None:
    src = e2e_tmp / "payload.bin"
    src.write_bytes(os.urandom(200_000))
    cfg = ["-F", str(cli.home / ".ssh" / "config"), "-o", "BatchMode=yes"]
    env = cli_env(cli.home)
    up = subprocess.run(
        ["scp", *cfg, str(src), "longer:/workflow/up.bin"], capture_output=True, text=True, env=env, timeout=60
    )
    assert up.returncode == 0, up.stderr
    back = e2e_tmp / "back.bin"
    down = subprocess.run(
        ["scp", *cfg, "longer:/workflow/up.bin", str(back)], capture_output=True, text=True, env=env, timeout=60
    )
    assert down.returncode == 0, down.stderr
    assert back.read_bytes() == src.read_bytes()
    batch = e2e_tmp / "sftp.batch"
    batch.write_text(f"put {src} /workflow/sftp.bin\nls -l /workflow\n")
    res = subprocess.run(
        ["sftp", *cfg, "-b", str(batch), "longer"], capture_output=True, text=True, env=env, timeout=60
    )
    assert res.returncode == 0 and "sftp.bin" in res.stdout, res.stdout + res.stderr
    owner = _ssh(cli, "longer", "stat -c %u /workflow/sftp.bin")
    assert owner.stdout.strip() == "0", "files are written as the job's user, not the server's"


def _login_with(cli: DstackCli, key: Path, run: str = "longer") -> subprocess.CompletedProcess[str]:
    """The ``<run>-host`` hop with ``key`` alone (no config: the CLI's entry would offer the user's key too)."""
    jpd = _run(cli.server, run)["jobs"][0]["job_submissions"][-1]["job_provisioning_data"]
    return subprocess.run(
        ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", "-i", str(key), "-p", str(jpd["ssh_port"]),
         f"{jpd['username']}@{jpd['hostname']}", "-W", "localhost:10022"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_wrong_key_and_another_users_key_are_refused(cli: DstackCli, attached: Any, e2e_tmp: Path) -> None:
    wrong = e2e_tmp / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
    res = _login_with(cli, wrong)
    assert res.returncode == 255 and "Permission denied (publickey)" in res.stderr, res.stderr
    # another member of the project, with a key of their own, is not let into this user's job
    other = cli.server.api("/api/users/create", {"username": "mallory", "global_role": "user"})
    assert other.status_code == 200, other.text
    members = {"members": [{"username": "mallory", "project_role": "user"}]}
    assert cli.server.api("/api/projects/main/add_members", members).status_code == 200
    token = cli.server.api("/api/users/get_user", {"username": "mallory"}).json()["creds"]["token"]
    mine = httpx.post(f"{cli.server.url}/api/users/get_my_user", headers={"Authorization": f"Bearer {token}"}).json()
    theirs = e2e_tmp / "mallory_key"
    theirs.write_text(mine["ssh_private_key"])
    theirs.chmod(0o600)
    res = _login_with(cli, theirs)
    assert res.returncode == 255 and "Permission denied (publickey)" in res.stderr, res.stderr
    # the user's own key (the one the CLI downloaded) is let in
    (own,) = [p for p in (cli.home / ".dstack" / "ssh").iterdir() if len(p.name) == 8]
    res = _login_with(cli, own)
    assert "Permission denied" not in res.stderr, res.stderr


def _corral_env(e2e_tmp: Path) -> dict[str, str]:
    """corral's CLI with the server's project (written into its config on first start) and a HOME of its own."""
    home = e2e_tmp / "corral-home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DSTACK_", "CORRAL_"))}
    return {**env, "HOME": str(home), "CORRAL_CONFIG_DIR": str(e2e_tmp / "corral-config"), "COLUMNS": "200"}


def _corral(e2e_tmp: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_corral_command(), *args], env=_corral_env(e2e_tmp), cwd=e2e_tmp, capture_output=True, text=True,
        timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_attached_corral_apply_streams_the_output_over_ssh(cli: DstackCli, e2e_tmp: Path) -> None:
    (e2e_tmp / "c.yml").write_text(
        f"type: task\nname: corral-short\ncommands:\n  - echo from-corral-apply\n{RESOURCES}"
    )
    res = _corral(e2e_tmp, "apply", "-f", str(e2e_tmp / "c.yml"), "-y")
    assert res.returncode == 0, res.stdout + res.stderr + cli.server.log_tail()
    assert "from-corral-apply" in res.stdout, res.stdout


def _corral_attach(e2e_tmp: Path, local: int) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [*_corral_command(), "attach", "longer", "-p", f"{local}:{APP_PORT}"], env=_corral_env(e2e_tmp), cwd=e2e_tmp,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "Press Ctrl+C to detach" in line:
            break
    return proc, "".join(lines)


def test_corral_attach_forwards_ports_and_writes_the_same_entries(cli: DstackCli, attached: Any, e2e_tmp: Path) -> None:
    local = free_port()
    home = e2e_tmp / "corral-home"
    for _attempt in range(2):  # the second attach right after a detach: its port is bound again at once
        proc, out = _corral_attach(e2e_tmp, local)
        try:
            assert "Attached to run longer" in out and f"localhost:{local} -> {APP_PORT}" in out, out
            assert "vscode://vscode-remote/ssh-remote+longer/workflow" in out, out
            body = httpx.get(f"http://localhost:{local}/index.html", timeout=10).text
            assert body.strip() == "served-by-the-job"
            config = (home / ".dstack" / "ssh" / "config").read_text().replace(str(home), "HOME")
            theirs = (cli.home / ".dstack" / "ssh" / "config").read_text().replace(str(cli.home), "HOME")
            assert config == theirs, "the official CLI's entries"
            assert (home / ".ssh" / "config").read_text().startswith(f"Include {home}/.dstack/ssh/config\n")
            res = subprocess.run(
                ["ssh", "-F", str(home / ".ssh" / "config"), "-o", "BatchMode=yes", "longer", "exit 5"],
                capture_output=True, text=True, timeout=60, env={**os.environ, "HOME": str(home)},
            )  # fmt: skip
            assert res.returncode == 5, res.stderr
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(20)
        assert "Host longer" not in (home / ".dstack" / "ssh" / "config").read_text(), "entries removed on exit"


def _attach(cli: DstackCli, *args: str) -> tuple[subprocess.Popen[str], str]:
    """``dstack ARGS``, read until it says it is attached (or the output ends)."""
    proc = subprocess.Popen(
        [str(cli.venv / "bin" / "dstack"), *args], cwd=cli.workdir, env=cli_env(cli.home),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "Press Ctrl+C to detach" in line or "started-detach-me" in line:
            break
    return proc, "".join(lines)


def _interrupt(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def test_ctrl_c_detaches_and_a_second_attach_reuses_the_tunnel(cli: DstackCli) -> None:
    cli.write(
        "detach.dstack.yml",
        f"type: task\nname: detach-me\ncommands:\n  - echo started-detach-me\n  - sleep 120\n{RESOURCES}",
    )
    applied, out = _attach(cli, "apply", "-f", "detach.dstack.yml", "-y")
    assert "started-detach-me" in out, out
    out += _interrupt(applied)  # Ctrl+C of an attached apply (-y: no question): detached, the run goes on
    assert "Detached" in out, out
    assert _run(cli.server, "detach-me")["status"] == "running"
    try:
        first, out = _attach(cli, "attach", "detach-me")
        assert "Attached to run detach-me" in out, out
        second, out = _attach(cli, "attach", "detach-me")  # the first one's tunnel is reused
        assert "Attached to run detach-me" in out, out
        assert _interrupt(second) is not None and first.poll() is None
        res = _ssh(cli, "detach-me", "echo through-the-first-tunnel")
        assert res.returncode == 0 and "through-the-first-tunnel" in res.stdout, res.stderr
        assert "Detached" in _interrupt(first)
        assert _run(cli.server, "detach-me")["status"] == "running"
    finally:
        cli.ok("stop", "detach-me", "-y")


def test_stop_closes_the_endpoint(cli: DstackCli, attached: Any) -> None:
    held = subprocess.Popen(
        ["ssh", "-F", str(cli.home / ".ssh" / "config"), "-o", "BatchMode=yes", "longer", "sleep 300"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(cli.home), stdin=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1.0)
    cli.ok("stop", "longer", "-y")
    try:
        rc = held.wait(30)
    finally:
        held.kill()
    assert rc != 0
    res = _ssh(cli, "longer", "true")
    assert res.returncode == 255, res.stdout + res.stderr


def test_inactivity_ends_an_idle_dev_environment_as_dstack_does(cli: DstackCli) -> None:
    cli.write("idle.dstack.yml", f"type: dev-environment\nname: idle\ninactivity_duration: 3s\n{RESOURCES}")
    cli.ok("apply", "-f", "idle.dstack.yml", "-y", "-d")
    deadline = time.monotonic() + 60
    while (run := _run(cli.server, "idle"))["status"] not in ("failed", "done", "terminated"):
        assert time.monotonic() < deadline, run
        time.sleep(0.5)
    sub = run["jobs"][0]["job_submissions"][-1]
    assert (run["status"], run["termination_reason"]) == ("failed", "job_failed"), run
    assert (sub["status"], sub["termination_reason"]) == ("terminated", "inactivity_duration_exceeded"), sub
    assert re.fullmatch(
        r"The job was inactive for \d+ seconds, exceeding the inactivity_duration of 3 seconds",
        sub["termination_reason_message"],
    ), sub


def _wait_running(cli: DstackCli, name: str, jobs: int = 1) -> dict[str, Any]:
    deadline = time.monotonic() + 90
    while True:
        run = _run(cli.server, name)
        subs = [j["job_submissions"][-1] for j in run["jobs"]]
        if len(subs) == jobs and all(s["status"] == "running" for s in subs):
            return run
        assert run["status"] not in ("failed", "done", "terminated") and time.monotonic() < deadline, run
        time.sleep(0.3)


#: The Python API's ``run.attach()`` of one job of a run, then plain OpenSSH through the entry it wrote.
ATTACH_API = """
import subprocess, sys
from dstack.api import Client
run = Client.from_config(project_name="main").runs.get(sys.argv[1])
run.attach(job_num=int(sys.argv[2]))
try:
    res = subprocess.run(["ssh", "-F", sys.argv[3], "-o", "BatchMode=yes", sys.argv[4], "echo rank=$DSTACK_NODE_RANK"],
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    print("ssh-rc", res.returncode, res.stdout.strip(), res.stderr.strip())
finally:
    run.detach()
"""


def test_python_api_attaches_to_the_second_job_of_a_multinode_task(cli: DstackCli, e2e_tmp: Path) -> None:
    cli.write("cluster.dstack.yml", f"type: fleet\nname: attach-cluster\nplacement: cluster\nnodes: 0..2\n{RESOURCES}")
    cli.ok("apply", "-f", "cluster.dstack.yml", "-y")
    cli.write(
        "pair.dstack.yml",
        f"type: task\nname: pair\nnodes: 2\nfleets: [attach-cluster]\ncommands:\n  - sleep 120\n{RESOURCES}",
    )
    cli.ok("apply", "-f", "pair.dstack.yml", "-y", "-d")
    try:
        run = _wait_running(cli, "pair", jobs=2)
        second = next(j for j in run["jobs"] if j["job_spec"]["job_num"] == 1)
        host = second["job_spec"]["job_name"]
        assert second["job_connection_info"]["attached_ssh_command"] == ["ssh", host]
        script = e2e_tmp / "attach_api.py"
        script.write_text(ATTACH_API)
        res = subprocess.run(
            [str(cli.venv / "bin" / "python"), str(script), "pair", "1", str(cli.home / ".ssh" / "config"), host],
            capture_output=True, text=True, timeout=120, env=cli_env(cli.home), cwd=cli.workdir,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert res.returncode == 0 and "ssh-rc 0 rank=1" in res.stdout, res.stdout + res.stderr
        assert f"Host {host}" not in (cli.home / ".dstack" / "ssh" / "config").read_text(), "detach removes its entries"
    finally:
        cli.ok("stop", "pair", "-y")


def test_refresh_ssh_key_revokes_the_old_key_at_once(cli: DstackCli, e2e_tmp: Path) -> None:
    """Last in the module: it replaces the user's key that the CLI downloaded."""
    cli.write("keyed.dstack.yml", f"type: task\nname: keyed\ncommands:\n  - sleep 120\n{RESOURCES}")
    cli.ok("apply", "-f", "keyed.dstack.yml", "-y", "-d")
    try:
        _wait_running(cli, "keyed")
        (old,) = [p for p in (cli.home / ".dstack" / "ssh").iterdir() if len(p.name) == 8]
        res = _login_with(cli, old, "keyed")
        assert "Permission denied" not in res.stderr, res.stderr
        fresh = cli.server.api("/api/users/refresh_ssh_key", {"username": "admin"})
        assert fresh.status_code == 200, fresh.text
        res = _login_with(cli, old, "keyed")
        assert res.returncode == 255 and "Permission denied (publickey)" in res.stderr, res.stderr
        new = e2e_tmp / "refreshed_key"
        new.write_text(fresh.json()["ssh_private_key"])
        new.chmod(0o600)
        res = _login_with(cli, new, "keyed")
        assert "Permission denied" not in res.stderr, res.stderr
    finally:
        cli.ok("stop", "keyed", "-y")
