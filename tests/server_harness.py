"""A real corral server (app, workers, local backend, SQLite) on a free loopback port, in-process.

Tests talk to it over HTTP with httpx, exactly as clients do.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from corral.server import KEEP_ALIVE_S, prepare
from corral.settings import Settings

ADMIN_TOKEN = "test-admin-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_settings(tmp: Path, **overrides: Any) -> Settings:
    base = Settings(
        server_dir=tmp / "server",
        database_url=f"sqlite+aiosqlite:///{tmp / 'server' / 'data' / 'corral.db'}",
        admin_token=ADMIN_TOKEN,
        safety_net_interval=60.0,  # prove that wake-ups, not polling, drive the work
        provisioning_timeout=20.0,
        agent_unreachable_timeout=5.0,
        agent_poll_wait=5.0,
        default_stop_duration=5.0,
        local_max_instances=8,
        # the local backend divides this machine among its instances: give the tests a machine of 16 blocks
        # (1 CPU, 8 GB each) whatever the machine running them has, so that 8 instances fit
        local_cpus=16,
        local_memory_mib=128 * 1024,
        write_cli_config=False,
        # Tests of the queue, retries, code etc. share files with their jobs through the host; the
        # sandbox (on by default as root) has tests of its own that turn it on.
        sandbox="off",
        # no emergency reserve file per test server (tests/workers/test_disk_full.py turns it on)
        disk_reserve=0,
    )
    return replace(base, **overrides)


@dataclass
class RunningServer:
    url: str
    token: str
    settings: Settings
    ctx: Any

    def client(self, token: str | None = None, **kw: Any) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token or self.token}"}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=30, **kw)


@contextlib.asynccontextmanager
async def running_server(settings: Settings, keep_agents: bool = False) -> AsyncIterator[RunningServer]:
    """The server, stopped at the end with every local agent it left behind ended, unless ``keep_agents`` (a
    test of a restart: a real server's exit leaves its agents and their jobs running)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))  # held from now on: the server is told its own address before it starts
    port = int(sock.getsockname()[1])
    settings = replace(settings, host="127.0.0.1", port=port)
    prepared = await prepare(settings)
    config = uvicorn.Config(
        prepared.app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        timeout_keep_alive=KEEP_ALIVE_S,  # as `corral server`: a client's idle connection is never closed under it
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    deadline = time.monotonic() + 10
    while not server.started:
        if task.done():
            task.result()
        if time.monotonic() > deadline:
            raise RuntimeError("test server did not start")
        await asyncio.sleep(0.01)
    try:
        yield RunningServer(f"http://127.0.0.1:{port}", prepared.admin_token, settings, prepared.ctx)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)
        # Terminate every local instance the test left behind (agents are detached processes).
        for compute in [] if keep_agents else prepared.ctx.computes.values():
            if hasattr(compute, "reap_grace"):
                compute.reap_grace = 0.0  # the test owns every agent under its own directory
            await compute.reap_unknown(set())
        await prepared.ctx.db.dispose()


async def wait_for(fn: Any, timeout: float = 20.0, interval: float = 0.05) -> Any:
    """Poll ``await fn()`` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await fn()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s (last value: {last!r})")


async def get_run(c: Any, name: str, project: str = "main") -> dict[str, Any]:
    """``runs/get`` of ``name`` (asserting a 200)."""
    r = await c.post(f"/api/project/{project}/runs/get", json={"run_name": name})
    assert r.status_code == 200, r.text
    return dict(r.json())


async def finished_run(c: Any, name: str, project: str = "main", timeout: float = 60.0) -> dict[str, Any]:
    """``runs/get`` of ``name`` once the run has finished (done, failed or terminated)."""

    async def check() -> dict[str, Any] | None:
        got = await get_run(c, name, project)
        return got if got["status"] in ("done", "failed", "terminated") else None

    return dict(await wait_for(check, timeout=timeout, interval=0.1))


SEED_BODY: dict[str, Any] = {
    "force": True,
    "plan": {
        "run_spec": {
            "configuration": {
                "type": "task",
                "creation_policy": "reuse-or-create",
                "commands": ["date", "sleep 6", "date"],
                "fleets": ["test-fleet"],
            }
        }
    },
}

SEED_FLEET = {"type": "fleet", "name": "test-fleet", "nodes": "0..3", "resources": {"cpu": "1.."}}


def task_body(commands: list[str], **conf: Any) -> dict[str, Any]:
    configuration = {
        "type": "task",
        "commands": commands,
        "resources": {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."},
    }
    configuration.update(conf)
    return {"force": False, "plan": {"run_spec": {"configuration": configuration}}}


def fleet_body(**conf: Any) -> dict[str, Any]:
    configuration = {
        "type": "fleet",
        "name": "fl",
        "nodes": "0..2",
        "resources": {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."},
    }
    configuration.update(conf)
    return {"force": False, "plan": {"spec": {"configuration": configuration, "profile": {}}}}
