"""Helpers of the SSH fleet tests: the fake hosts they use, running commands on them, and driving a
server's fleets, runs and CLI against them. (Fixtures are in ``conftest.py``.)

The hosts: ``gpu`` (a fake ``nvidia-smi`` with 2 x A100 80GB), ``amd`` (a fake ``amd-smi`` with
2 x MI300X 192GB), ``cpu1`` and ``cpu2`` (plain), ``hidden`` (sshd accepts root only from ``gpu``'s
address: reachable only through a proxy jump) and ``bare`` (no ``python3``); ``cpu2`` and ``bare`` also
have an account ``nologin`` whose shell refuses every command.
"""

from __future__ import annotations

import asyncio
import base64
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh
import httpx

from corral.sdk import config_file
from fakehosts import FakeHosts, HostSpec
from server_harness import RunningServer, wait_for

HOSTS = {
    "gpu": HostSpec(gpus=2),
    "cpu1": HostSpec(),
    "cpu2": HostSpec(nologin_user=True),
    "hidden": HostSpec(sshd_extra="AllowUsers root@{subnet}.11"),
    "bare": HostSpec(no_python=True, nologin_user=True),
    "amd": HostSpec(amd_gpus=2),
}
#: Kill everything but sshd and this shell (agents and their jobs), remove what corral installed.
CLEAN_HOST = (
    "ps -eo pid=,comm= | awk '$2 !~ /^(sshd|bash|sh|ps|awk|xargs)$/ {print $1}' | xargs -r kill -9; "
    'rm -rf "$HOME/.corral-agent" "$HOME/.corral-gateway" /etc/systemd/system/corral-agent.service; true'
)


@dataclass(frozen=True)
class HostRun:
    """What a command run on a fake host gave: its exit status and its output as text."""

    exit_status: int | None
    stdout: str
    stderr: str


def _ran(done: asyncssh.SSHCompletedProcess) -> HostRun:
    def text(out: bytes | str | None) -> str:
        return out.decode() if isinstance(out, bytes) else (out or "")

    return HostRun(done.exit_status, text(done.stdout), text(done.stderr))


async def host_run(fh: FakeHosts, host: str, command: str, user: str = "root") -> HostRun:
    """Run ``command`` on a fake host (as the tests' own SSH client; ``hidden`` through ``gpu``)."""
    key = asyncssh.import_private_key(fh.key.read_text())
    opts: dict[str, Any] = {"username": user, "client_keys": [key], "known_hosts": None, "config": None}
    if host == "hidden":
        async with (
            asyncssh.connect(fh.ip("gpu"), **opts) as jump,
            asyncssh.connect(fh.ip(host), tunnel=jump, **opts) as conn,
        ):
            return _ran(await conn.run(command, check=False))
    async with asyncssh.connect(fh.ip(host), **opts) as conn:
        return _ran(await conn.run(command, check=False))


SSH_SETTINGS: dict[str, Any] = {
    "provisioning_timeout": 6.0,
    "ssh_connect_timeout": 3.0,
    "instance_check_interval": 0.5,
    "agent_unreachable_timeout": 3.0,
    "agent_poll_wait": 2.0,
}


async def stop_all_runs(c: httpx.AsyncClient) -> None:
    runs = (await c.post("/api/runs/list", json={})).json()
    live: dict[str, list[str]] = {}
    for r in runs:
        if r["status"] not in ("done", "failed", "terminated"):
            live.setdefault(r["project_name"], []).append(r["run_spec"]["run_name"])
    for project, names in live.items():
        await c.post(f"/api/project/{project}/runs/stop", json={"runs_names": names, "abort": True})
    if live:

        async def stopped() -> bool:
            runs = (await c.post("/api/runs/list", json={})).json()
            return all(r["status"] in ("done", "failed", "terminated") for r in runs)

        await wait_for(stopped, timeout=30)


async def delete_all_fleets(c: httpx.AsyncClient) -> None:
    """Stop every run, delete every fleet of ``main`` and wait until corral has removed them (and so has
    cleaned the hosts where it can)."""
    await stop_all_runs(c)
    for f in (await c.post("/api/project/main/fleets/list", json={})).json():
        await c.post("/api/project/main/fleets/delete", json={"names": [f["name"]]})

    async def no_fleets() -> bool:
        return not (await c.post("/api/project/main/fleets/list", json={})).json()

    await wait_for(no_fleets, timeout=30)


def ssh_key(fh: FakeHosts, wrong: bool = False) -> dict[str, str]:
    path = fh.wrong_key if wrong else fh.key
    return {"public": Path(f"{path}.pub").read_text().strip(), "private": path.read_text()}


def ssh_fleet(fh: FakeHosts, name: str, hosts: list[Any], **conf: Any) -> dict[str, Any]:
    """A fleet configuration as the CLI sends it: ``identity_file`` resolved into ``ssh_key``."""
    ssh = {"user": "root", "identity_file": str(fh.key), "ssh_key": ssh_key(fh), "hosts": hosts}
    ssh.update(conf.pop("ssh_config", {}))
    return {"type": "fleet", "name": name, "ssh_config": ssh, **conf}


async def plan_fleet(c: httpx.AsyncClient, configuration: dict[str, Any]) -> dict[str, Any]:
    r = await c.post(
        "/api/project/main/fleets/get_plan", json={"spec": {"configuration": configuration, "profile": {}}}
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


async def apply_fleet(c: httpx.AsyncClient, configuration: dict[str, Any]) -> dict[str, Any]:
    """get_plan then apply with the plan's current resource (an in-place update when it exists)."""
    spec = {"configuration": configuration, "profile": {}}
    plan = await plan_fleet(c, configuration)
    body = {"force": False, "plan": {"spec": spec, "current_resource": plan["current_resource"]}}
    r = await c.post("/api/project/main/fleets/apply", json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


async def get_fleet(c: httpx.AsyncClient, name: str) -> dict[str, Any]:
    r = await c.post("/api/project/main/fleets/get", json={"name": name})
    assert r.status_code == 200, r.text
    return dict(r.json())


async def fleet_settled(c: httpx.AsyncClient, name: str, count: int | None = None) -> dict[str, Any] | None:
    """The fleet once no instance is pending, provisioning or terminating (None before)."""
    f = await get_fleet(c, name)
    insts = f["instances"]
    if any(i["status"] in ("pending", "provisioning", "terminating") for i in insts):
        return None
    if count is not None and len(insts) != count:
        return None
    return f


def by_host(fleet: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {i["hostname"]: i for i in fleet["instances"]}


async def run_get(c: httpx.AsyncClient, name: str) -> dict[str, Any]:
    r = await c.post("/api/project/main/runs/get", json={"run_name": name})
    assert r.status_code == 200, r.text
    return dict(r.json())


async def submit(c: httpx.AsyncClient, name: str, commands: list[str], **conf: Any) -> None:
    configuration = {
        "type": "task",
        "name": name,
        "commands": commands,
        "resources": {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."},
    }
    resources = conf.pop("resources", None)
    if resources:
        configuration["resources"] = {**configuration["resources"], **resources}  # type: ignore[dict-item]
    configuration.update(conf)
    body = {"force": False, "plan": {"run_spec": {"configuration": configuration}}}
    r = await c.post("/api/project/main/runs/apply", json=body)
    assert r.status_code == 200, r.text


async def run_status(c: httpx.AsyncClient, name: str, *statuses: str, timeout: float = 30) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        r = await run_get(c, name)
        return r if r["status"] in statuses else None

    return dict(await wait_for(reached, timeout=timeout))


async def run_logs(c: httpx.AsyncClient, run: dict[str, Any]) -> str:
    sub = run["latest_job_submission"]["id"]
    r = await c.post(
        "/api/project/main/logs/poll",
        json={"run_name": run["run_spec"]["run_name"], "job_submission_id": sub, "limit": 1000},
    )
    return b"".join(base64.b64decode(x["message"]) for x in r.json()["logs"]).decode()


async def corral_cli(server: RunningServer, tmp_path: Path, *args: str) -> tuple[int, str]:
    """The ``corral`` CLI as a process against the in-process server (without blocking its loop)."""
    cfg = tmp_path / "cli"
    env = {**os.environ, "CORRAL_CONFIG_DIR": str(cfg), "COLUMNS": "250", "NO_COLOR": "1"}
    old = os.environ.get("CORRAL_CONFIG_DIR")
    os.environ["CORRAL_CONFIG_DIR"] = str(cfg)
    try:
        config_file.add_project("main", server.url, server.token, default=True)
    finally:
        if old is None:
            del os.environ["CORRAL_CONFIG_DIR"]
        else:
            os.environ["CORRAL_CONFIG_DIR"] = old
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "corral.cli.main",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    text = out.decode()
    assert "Traceback" not in text, text
    return proc.returncode or 0, text
