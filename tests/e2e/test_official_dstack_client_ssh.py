"""The official dstack 0.22.5 CLI, unchanged, with an SSH fleet of two fake hosts (see ``fakehosts``):
``dstack apply`` of the fleet (the client reads ``identity_file`` and sends the key), ``dstack fleet``, a
GPU task placed on the host with the GPU (attached: its output over corral's SSH endpoint), and ``dstack
fleet delete`` cleaning the hosts."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dstack_client_env import (
    DSTACK_VERSION,
    ClientInstallError,
    CorralServer,
    DstackCli,
    client_venv,
    corral_server,
    short_home,
)
from test_official_dstack_client import rows

from fakehosts import FakeHosts, HostSpec

TOKEN = "e2e-ssh-admin-token-0123456789"


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHosts]:
    if os.geteuid() != 0:
        pytest.fail("the SSH fleet tests need root (network namespaces); CI runs them as root")
    fh = FakeHosts({"withgpu": HostSpec(gpus=1), "plain": HostSpec()}, tmp_path_factory.mktemp("dstack-ssh-hosts"))
    fh.start()
    try:
        yield fh
    finally:
        fh.stop()


@pytest.fixture(name="short_home")
def _short_home() -> Iterator[Path]:
    with short_home() as home:
        yield home


def _on_host(fh: FakeHosts, host: str, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", "-i", str(fh.key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
         "-o", "BatchMode=yes", f"root@{fh.ip(host)}", command],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def _fleet(server: CorralServer) -> dict[str, Any]:
    return dict(server.api("/api/project/main/fleets/get", {"name": "my-ssh"}).json())


def _run(server: CorralServer, name: str) -> dict[str, Any]:
    return dict(server.api("/api/project/main/runs/get", {"run_name": name}).json())


def _wait(condition: Callable[[], bool], cli: DstackCli, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, cli.server.log_tail()
        time.sleep(0.2)


def test_ssh_fleet_with_the_official_client(hosts: FakeHosts, tmp_path: Path, short_home: Path) -> None:
    try:
        venv = client_venv()
    except ClientInstallError as e:
        pytest.fail(f"could not install dstack=={DSTACK_VERSION}:\n{e}", pytrace=False)
    with corral_server(tmp_path, TOKEN, CORRAL_PROVISIONING_TIMEOUT="20", CORRAL_INSTANCE_CHECK_INTERVAL="1") as server:
        (tmp_path / "work").mkdir()
        cli = DstackCli(venv, short_home, tmp_path / "work", server)
        cli.ok("project", "add", "--name", "main", "--url", server.url, "--token", TOKEN, "-y")
        cli.write(
            "fleet.dstack.yml",
            "type: fleet\nname: my-ssh\nssh_config:\n  user: root\n"
            f"  identity_file: {hosts.key}\n  hosts:\n    - {hosts.ip('withgpu')}\n    - {hosts.ip('plain')}\n",
        )
        res = cli.ok("apply", "-f", "fleet.dstack.yml", "-y", timeout=180)
        assert "my-ssh" in res.output, cli.explain(res)
        _wait(lambda: [i["status"] for i in _fleet(server)["instances"]] == ["idle", "idle"], cli)
        res = cli.ok("fleet")  # the client parses every instance with its own models
        assert len(rows(res.stdout, "my-ssh")) == 1 and res.stdout.count("idle") == 2, cli.explain(res)
        assert "A100" in res.stdout, cli.explain(res)

        cli.write(
            "task.dstack.yml",
            "type: task\nname: on-gpu\ncommands:\n  - hostname\nresources:\n  cpu: 1..\n  memory: 0.1GB..\n"
            "  disk: 1GB..\n  gpu: 1\n",
        )
        # attached: the output comes over corral's SSH endpoint (the job may have ended already: the
        # endpoint answers for a while after, so that the client reads the output to its end)
        res = cli.ok("apply", "-f", "task.dstack.yml", "-y", timeout=180)
        assert "withgpu" in res.stdout.split(), cli.explain(res)
        run = _run(server, "on-gpu")
        assert run["status"] == "done", cli.explain(res)
        assert run["latest_job_submission"]["job_provisioning_data"]["internal_ip"] == hosts.ip("withgpu")

        res = cli.ok("fleet", "delete", "my-ssh", "-y")
        _wait(lambda: not server.api("/api/project/main/fleets/list", {}).json(), cli)
        for host in ("withgpu", "plain"):
            left = _on_host(hosts, host, "ls -d ~/.corral-agent; ps -eo args= | grep -c '[a]gent.pyz'")
            assert left.stdout.strip() == "0", left
        log = server.log_path.read_text(errors="replace")
        assert "Traceback" not in log, server.log_tail(200)
