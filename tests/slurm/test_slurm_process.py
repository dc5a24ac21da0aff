"""``corral server`` as a process against the real test cluster: killed with SIGKILL mid-run and started again, the
run is settled and no Slurm job is left; and the official dstack 0.22.5 CLI, unchanged, applying a task and a
2-node task on a Slurm fleet, ``dstack logs`` showing both nodes' output."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from dstack_client_env import (
    DSTACK_VERSION,
    ClientInstallError,
    CorralServer,
    DstackCli,
    client_venv,
    corral_server,
    short_home,
)
from test_slurm_runs import corral_jobs, slurm_config

from skip_policy import needs_root
from slurm_harness import CPU_NODES, SlurmTestCluster

pytestmark = needs_root("the Slurm cluster runs in network namespaces")

TOKEN = "e2e-slurm-admin-token-0123456789"
ENV = {"CORRAL_INSTANCE_CHECK_INTERVAL": "1", "CORRAL_SAFETY_NET_INTERVAL": "2", "CORRAL_PROVISIONING_TIMEOUT": "120"}


def _config(slurm: SlurmTestCluster, tmp: Path) -> None:
    key = tmp / "cluster_key"
    key.write_text(slurm.key_pem())
    key.chmod(0o600)
    (tmp / "server").mkdir(parents=True, exist_ok=True)
    (tmp / "server" / "config.yml").write_text(yaml.safe_dump(slurm_config(slurm, key)))


def _wait(condition: Callable[[], Any], server: CorralServer, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, server.log_tail(80)
        time.sleep(0.25)
    return value


def _run(server: CorralServer, name: str) -> dict[str, Any]:
    return dict(server.api("/api/project/main/runs/get", {"run_name": name}).json())


def _fleet(server: CorralServer, **conf: Any) -> None:
    configuration = {"type": "fleet", "name": "hpc", "nodes": "0..3", "backends": ["slurm"], **conf}
    body = {"force": False, "plan": {"spec": {"configuration": configuration, "profile": {}}}}
    r = server.api("/api/project/main/fleets/apply", body)
    assert r.status_code == 200, r.text


def test_a_server_killed_mid_run_and_started_again_leaves_no_slurm_job(slurm: SlurmTestCluster, tmp_path: Path) -> None:
    _config(slurm, tmp_path)
    with corral_server(tmp_path, TOKEN, **ENV) as server:
        _fleet(server)
        task: dict[str, Any] = {"type": "task", "name": "survivor", "commands": ["sleep 8; echo finished"]}
        task.update(fleets=["hpc"], resources={"cpu": "1..", "memory": "0.1GB.."})
        r = server.api("/api/project/main/runs/apply", {"force": True, "plan": {"run_spec": {"configuration": task}}})
        assert r.status_code == 200, r.text
        _wait(lambda: _run(server, "survivor")["status"] == "running" and corral_jobs(slurm, ("RUNNING",)), server)
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(10)
    with corral_server(tmp_path, TOKEN, **ENV) as server:
        run = _wait(lambda: (r := _run(server, "survivor"))["status"] in ("done", "failed", "terminated") and r, server)
        assert run["status"] == "done", run  # the agent ran on in its allocation; the new server followed it
        _wait(lambda: not corral_jobs(slurm, ("PENDING", "RUNNING", "COMPLETING")), server, timeout=60)
        log = server.log_path.read_text(errors="replace")
        assert "Traceback" not in log, server.log_tail(200)


@pytest.fixture(name="short_home")
def _short_home() -> Iterator[Path]:
    with short_home() as home:
        yield home


def test_the_official_client_runs_tasks_on_slurm(slurm: SlurmTestCluster, tmp_path: Path, short_home: Path) -> None:
    try:
        venv = client_venv()
    except ClientInstallError as e:
        pytest.fail(f"could not install dstack=={DSTACK_VERSION}:\n{e}", pytrace=False)
    _config(slurm, tmp_path)
    with corral_server(tmp_path, TOKEN, **ENV) as server:
        (tmp_path / "work").mkdir()
        cli = DstackCli(venv, short_home, tmp_path / "work", server)
        cli.ok("project", "add", "--name", "main", "--url", server.url, "--token", TOKEN, "-y")
        cli.write("fleet.dstack.yml", "type: fleet\nname: hpc\nnodes: 0..3\nplacement: cluster\nbackends: [slurm]\n")
        res = cli.ok("apply", "-f", "fleet.dstack.yml", "-y", timeout=120)
        assert "hpc" in res.output, cli.explain(res)
        resources = "resources:\n  cpu: 1..\n  memory: 0.1GB..\n"
        cli.write(
            "task.dstack.yml",
            f"type: task\nname: on-slurm\nfleets: [hpc]\ncommands:\n  - echo hi from $(hostname)\n{resources}",
        )
        res = cli.ok("apply", "-f", "task.dstack.yml", "-y", "-d", timeout=120)
        run = _wait(lambda: (r := _run(server, "on-slurm"))["status"] in ("done", "failed") and r, server)
        assert run["status"] == "done", cli.explain(res)
        res = cli.ok("logs", "on-slurm")
        assert any(f"hi from {n}" in res.stdout for n in CPU_NODES), cli.explain(res)

        say = 'echo "node $DSTACK_NODE_RANK of $DSTACK_NODES_NUM on $(hostname)"'
        cli.write(
            "pair.dstack.yml", f"type: task\nname: pair\nnodes: 2\nfleets: [hpc]\ncommands:\n  - {say}\n{resources}"
        )
        res = cli.ok("apply", "-f", "pair.dstack.yml", "-y", "-d", timeout=120)
        run = _wait(lambda: (r := _run(server, "pair"))["status"] in ("done", "failed") and r, server)
        assert run["status"] == "done", cli.explain(res)
        outputs = [cli.ok("logs", "pair", "--job", str(j)).stdout for j in (0, 1)]
        assert "node 0 of 2 on" in outputs[0] and "node 1 of 2 on" in outputs[1], outputs
        res = cli.ok("ps", "-a")
        assert "on-slurm" in res.stdout and "pair" in res.stdout, cli.explain(res)
        cli.ok("fleet", "delete", "hpc", "-y")
        _wait(lambda: not server.api("/api/project/main/fleets/list", {}).json(), server)
        _wait(lambda: not corral_jobs(slurm, ("PENDING", "RUNNING", "COMPLETING")), server, timeout=60)
