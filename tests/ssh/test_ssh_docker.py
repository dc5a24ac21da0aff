"""Jobs with an ``image`` on an SSH fleet's host that has its own Docker engine: a fake host (see
``fakehosts``) runs ``dockerd`` at the default socket, a real server bootstraps corral's agent there over
SSH, and the runs go through the server as users send them. What the local container tests show holds
through SSH too: the engine is detected, the commands run in a container of the image (logs, env,
working dir), a port is published on the host's address (host networking for a whole host, a bridge
with a mapped port and limits for a job on some blocks), a missing image fails with a clear message,
a stop removes the container, and no container outlives its job, not even when the agent is killed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ssh_harness import (
    SSH_SETTINGS,
    apply_fleet,
    delete_all_fleets,
    fleet_settled,
    host_run,
    run_get,
    run_logs,
    run_status,
    ssh_fleet,
    submit,
)

from corral.agent.containers import LABEL_AGENT, LABEL_RUN
from docker_harness import UBUNTU, Registry, busybox_rootfs, require_tools
from fakehosts import FakeHosts, HostSpec
from server_harness import RunningServer, make_settings, running_server, wait_for

HOST = "dock"
#: What the agent on the host says about its engine (its own ``GET /info``, asked on the host).
AGENT_INFO = """python3 - <<'EOF'
import json, os, urllib.request
d = os.path.expanduser("~/.corral-agent")
port = open(d + "/work/agent.port").read().strip()
token = open(d + "/agent.token").read().strip()
req = urllib.request.Request("http://127.0.0.1:%s/info" % port, headers={"Authorization": "Bearer " + token})
print(json.load(urllib.request.urlopen(req, timeout=10))["container_runtime"])
EOF"""
#: Stop corral's agent on the host (never the host's dockerd) and remove what corral put there.
CLEAN_AGENT = (
    'pid=$(cat "$HOME/.corral-agent/work/agent.pid" 2>/dev/null) && kill -9 "$pid" 2>/dev/null; '
    'rm -rf "$HOME/.corral-agent"; true'
)


@pytest.fixture(scope="module")
def dock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHosts]:
    """One fake host with its own dockerd and ``ubuntu:22.04`` (a busybox root file system) in it."""
    require_tools()
    fh = FakeHosts({HOST: HostSpec(docker=True)}, tmp_path_factory.mktemp("dockhost")).start()
    try:
        fh.docker(HOST, "import", "-", UBUNTU, input=busybox_rootfs())
        yield fh
    finally:
        fh.stop()


async def _on_host(fh: FakeHosts, command: str) -> str:
    """What ``command`` prints on the host, run through SSH as a user would."""
    out = (await host_run(fh, HOST, command)).stdout
    return (out.decode() if isinstance(out, bytes) else out or "").strip()


def _containers(fh: FakeHosts, label: str = LABEL_AGENT) -> list[str]:
    return fh.docker(HOST, "ps", "-aq", "--filter", f"label={label}").split()


@pytest.fixture
async def server(tmp_path: Path, dock: FakeHosts) -> AsyncIterator[RunningServer]:
    """A server whose fleets are deleted (by corral) after the test; the host's engine is then left
    without any container of corral's, and the host without its agent."""
    try:
        # The agent may be away a while (killed, then started again) without failing its jobs.
        async with running_server(make_settings(tmp_path, **{**SSH_SETTINGS, "agent_unreachable_timeout": 20.0})) as s:
            yield s
            async with s.client() as c:
                await delete_all_fleets(c)
        assert _containers(dock) == [], "a container outlived its job, agent and fleet"
    finally:
        await host_run(dock, HOST, CLEAN_AGENT)
        dock.exec(HOST, "docker ps -aq --filter label=corral.agent | xargs -r docker rm -f")


async def _fleet(c: httpx.AsyncClient, fh: FakeHosts, **conf: Any) -> dict[str, Any]:
    await apply_fleet(c, ssh_fleet(fh, "docked", [fh.ip(HOST)], **conf))
    fleet = await wait_for(lambda: fleet_settled(c, "docked", 1), timeout=30)
    (inst,) = fleet["instances"]
    assert inst["status"] == "idle" and inst["corral_backend"] == "ssh", inst
    return dict(inst)


async def _get(url: str, timeout: float = 20) -> str:
    """The body at ``url`` once something answers there."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=1) as client:
        while True:
            try:
                return (await client.get(url)).text
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)


async def _logs_contain(c: httpx.AsyncClient, name: str, text: str) -> bool:
    return text in await run_logs(c, await run_get(c, name))


async def test_jobs_in_containers_on_an_ssh_host(server: RunningServer, dock: FakeHosts, tmp_path: Path) -> None:
    registry = Registry(tmp_path / "registry", host=dock.gateway).start()  # on the fleet's network, empty
    try:
        async with server.client() as c:
            await _fleet(c, dock)
            assert await _on_host(dock, AGENT_INFO) == "docker"

            # The commands run in a container of the image, on the host's network, with env and working dir.
            script = [
                'echo "env=$FOO|$DSTACK_RUN_NAME"',
                "echo pwd=$(pwd)",
                "echo host=$(hostname)",
                "echo pid1=$(cat /proc/1/comm)",
                "echo image=$(readlink /bin/sh)",  # busybox: the image's own root file system
                "sleep 1",
            ]
            await submit(c, "inside", script, image=UBUNTU, env={"FOO": "bar baz"}, working_dir="/srv/app")
            await wait_for(lambda: _logs_contain(c, "inside", "pid1="), timeout=30)
            assert len(_containers(dock, f"{LABEL_RUN}=inside")) == 1
            run = await run_status(c, "inside", "done", "failed")
            sub = run["latest_job_submission"]
            assert (run["status"], sub["exit_status"]) == ("done", 0), sub
            assert sub["job_runtime_data"]["network_mode"] == "host"
            assert (await run_logs(c, run)).splitlines() == [
                "env=bar baz|inside",
                "pwd=/srv/app",
                f"host={HOST}",
                "pid1=docker-init",
                "image=busybox",
            ]
            assert _containers(dock, f"{LABEL_RUN}=inside") == []  # removed once the job ended

            # A port: published on the host's own address (host networking), reachable from here.
            port = 18080
            serve = [f"mkdir -p /www && echo hello-from-{HOST} > /www/index.html", f"httpd -f -p {port} -h /www"]
            await submit(c, "web", serve, image=UBUNTU, ports=[port])
            await run_status(c, "web", "running")
            assert await _get(f"http://{dock.ip(HOST)}:{port}/") == f"hello-from-{HOST}\n"
            runtime = (await run_get(c, "web"))["latest_job_submission"]["job_runtime_data"]
            assert (runtime["network_mode"], runtime["ports"]) == ("host", {}), runtime  # dstack: {} on host networking
            # Stop: the container is stopped and removed.
            assert len(_containers(dock, f"{LABEL_RUN}=web")) == 1
            await c.post("/api/project/main/runs/stop", json={"runs_names": ["web"], "abort": False})
            run = await run_status(c, "web", "terminated", "failed", "done")
            assert (run["status"], run["latest_job_submission"]["termination_reason"]) == (
                "terminated",
                "terminated_by_user",
            )
            assert _containers(dock, f"{LABEL_RUN}=web") == []

            # Pulls the host's engine cannot do fail clearly: a missing image, an unreachable registry.
            missing = f"{registry.address}/not-there:1"
            await submit(c, "missing", ["true"], image=missing)
            await submit(c, "unreachable", ["true"], image="127.0.0.1:1/x:1")
            sub = (await run_status(c, "missing", "done", "failed", "terminated"))["latest_job_submission"]
            assert sub["termination_reason"] == "creating_container_error", sub
            assert sub["termination_reason_message"].startswith(f"Image `{missing}` was not found in its registry")
            sub = (await run_status(c, "unreachable", "done", "failed", "terminated"))["latest_job_submission"]
            assert sub["termination_reason"] == "creating_container_error", sub
            assert "the registry 127.0.0.1:1 is unreachable" in sub["termination_reason_message"]
            assert _containers(dock) == []
    finally:
        registry.stop()


async def test_job_on_blocks_gets_a_bridge_a_mapped_port_and_limits(server: RunningServer, dock: FakeHosts) -> None:
    async with server.client() as c:
        inst = await _fleet(c, dock, blocks=2)
        memory_mib = inst["instance_type"]["resources"]["memory_mib"]
        serve = [
            "echo mem=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes)",
            "mkdir -p /www && echo hello-from-a-block > /www/index.html",
            "httpd -f -p 8080 -h /www",
        ]
        await submit(c, "half", serve, image=UBUNTU, ports=[8080])

        async def mapped() -> dict[str, Any] | None:
            sub = (await run_get(c, "half"))["latest_job_submission"]
            return sub if sub["status"] == "running" and sub["job_runtime_data"]["ports"] else None

        runtime = (await wait_for(mapped, timeout=30))["job_runtime_data"]
        assert runtime["network_mode"] == "bridge" and runtime["memory"] == round(memory_mib // 2 / 1024, 3)
        host_port = runtime["ports"]["8080"]
        assert host_port != 8080
        assert await _get(f"http://{dock.ip(HOST)}:{host_port}/") == "hello-from-a-block\n"
        # The job's output reaches the server with its next log read: wait for it rather than race it.
        await wait_for(lambda: _logs_contain(c, "half", f"mem={memory_mib // 2 * 2**20}\n"), timeout=15)
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["half"], "abort": False})
        run = await run_status(c, "half", "terminated", "failed", "done")
        assert run["status"] == "terminated", run["latest_job_submission"]
        assert _containers(dock) == []


async def test_killed_agent_is_restarted_and_finds_its_container_again(server: RunningServer, dock: FakeHosts) -> None:
    async with server.client() as c:
        await _fleet(c, dock)
        wait_for_go = "while [ ! -f /tmp/go ]; do sleep 0.1; done"
        await submit(c, "long", ["echo started", wait_for_go, "echo after the restart"], image=UBUNTU)
        await wait_for(lambda: _logs_contain(c, "long", "started"), timeout=30)
        (container,) = _containers(dock, f"{LABEL_RUN}=long")
        pid = await _on_host(dock, "cat ~/.corral-agent/work/agent.pid")
        await _on_host(dock, f"kill -9 {pid}")  # the agent cannot clean up; its container runs on

        async def new_agent() -> bool:
            now = await _on_host(dock, "cat ~/.corral-agent/work/agent.pid")
            return bool(now) and now != pid

        await wait_for(new_agent, timeout=30)  # the server starts the agent again over SSH
        assert (await run_get(c, "long"))["status"] == "running"
        dock.docker(HOST, "exec", container, "touch", "/tmp/go")  # the job goes on to its end...
        run = await run_status(c, "long", "done", "failed", "terminated")
        assert run["status"] == "done", run["latest_job_submission"]  # ...followed by the new agent
        assert await run_logs(c, run) == "started\nafter the restart\n"
        assert _containers(dock) == []


async def test_fleet_delete_removes_the_containers_of_a_killed_agent(dock: FakeHosts, tmp_path: Path) -> None:
    """An agent killed with its job's container running cannot remove it; deleting the fleet does (the
    server runs ``agent.pyz cleanup`` on the host before it removes the agent's files)."""
    # No host checks: they would start the agent again, and a new agent sweeps what no job owns itself.
    settings = make_settings(tmp_path, **{**SSH_SETTINGS, "instance_check_interval": 3600.0})
    try:
        async with running_server(settings) as s, s.client() as c:
            await _fleet(c, dock)
            await submit(c, "orphan", ["echo started", "sleep 600"], image=UBUNTU)
            await wait_for(lambda: _logs_contain(c, "orphan", "started"), timeout=30)
            (container,) = _containers(dock, f"{LABEL_RUN}=orphan")
            await _on_host(dock, 'kill -9 "$(cat ~/.corral-agent/work/agent.pid)"')
            run = await run_status(c, "orphan", "failed", "terminated", "done", timeout=30)
            assert run["latest_job_submission"]["termination_reason"] == "instance_unreachable", run
            assert _containers(dock, f"{LABEL_RUN}=orphan") == [container]  # nobody was left to remove it

            await c.post("/api/project/main/fleets/delete", json={"names": ["docked"]})

            async def no_fleets() -> bool:
                return not (await c.post("/api/project/main/fleets/list", json={})).json()

            await wait_for(no_fleets, timeout=30)
        assert _containers(dock) == []
        assert await _on_host(dock, "ls -d ~/.corral-agent 2>/dev/null || echo gone") == "gone"
    finally:
        await host_run(dock, HOST, CLEAN_AGENT)
        dock.exec(HOST, "docker ps -aq --filter label=corral.agent | xargs -r docker rm -f")
