"""The job sandbox on SSH fleets' hosts: their agents get the server's ``CORRAL_SANDBOX`` and
``CORRAL_JOB_UID_RANGE`` as local agents do, and a host-process job there runs under a uid of that range."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
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
    run_logs,
    run_status,
    ssh_fleet,
    submit,
)

from fakehosts import FakeHosts
from server_harness import RunningServer, make_settings, running_server, wait_for

UIDS = "300000-300099"


@asynccontextmanager
async def _server(tmp_path: Path, **settings: Any) -> AsyncIterator[RunningServer]:
    """A server with the SSH tests' settings and ``settings``; its fleets are deleted at the end."""
    async with running_server(make_settings(tmp_path, **SSH_SETTINGS, **settings)) as s:
        yield s
        async with s.client() as c:
            await delete_all_fleets(c)


@pytest.fixture
async def sandbox_server(tmp_path: Path, hosts: FakeHosts) -> AsyncIterator[RunningServer]:
    async with _server(tmp_path, sandbox="auto", job_uid_range=UIDS) as s:
        yield s


async def test_an_ssh_hosts_agent_gets_the_servers_sandbox_settings(
    sandbox_server: RunningServer, hosts: FakeHosts
) -> None:
    async with sandbox_server.client() as c:
        await apply_fleet(c, ssh_fleet(hosts, "one", [hosts.ip("cpu1")]))
        fleet = await wait_for(lambda: fleet_settled(c, "one", 1), timeout=30)
        assert fleet["instances"][0]["status"] == "idle", fleet
        args = (await host_run(hosts, "cpu1", "ps -eo args= | grep '[a]gent.pyz serve'")).stdout
        assert f"--sandbox auto --uid-range {UIDS}" in args, args

        await submit(c, "whoami", ["id -u"])
        run = await run_status(c, "whoami", "done", "failed")
        job = run["latest_job_submission"]
        assert run["status"] == "done", job
        uid = int((await run_logs(c, run)).strip())
        assert 300000 <= uid <= 300099, uid  # the job's own uid, from the server's range


async def test_an_ssh_hosts_agent_runs_jobs_unsandboxed_when_the_server_turns_the_sandbox_off(
    server: RunningServer, hosts: FakeHosts
) -> None:
    async with server.client() as c:  # the tests' server runs with CORRAL_SANDBOX=off
        await apply_fleet(c, ssh_fleet(hosts, "one", [hosts.ip("cpu1")]))
        await wait_for(lambda: fleet_settled(c, "one", 1), timeout=30)
        await submit(c, "plain", ["id -u", "sleep 30"])
        run = await run_status(c, "plain", "running", "failed")
        job = run["latest_job_submission"]
        assert run["status"] == "running", job
        assert job["status_message"] == "Runs without a sandbox: the sandbox is turned off (--sandbox off)", job
        await wait_for(lambda: _logged(c, run), timeout=30)


async def _logged(c: httpx.AsyncClient, run: dict[str, Any]) -> bool:
    return (await run_logs(c, run)).strip() == "0"  # as the agent's user (root), not a uid of its own


#: Hide `ip` from the host (a host without iproute2 cannot give jobs a network of their own), and back.
HIDE_IP = 'for p in $(which -a ip | sort -u); do [ -e "$p" ] && mv "$p" "$p.hidden"; done; true'
SHOW_IP = 'for p in /usr/sbin/ip /sbin/ip /usr/bin/ip /bin/ip; do [ -e "$p.hidden" ] && mv "$p.hidden" "$p"; done; true'


async def test_sandbox_on_fails_an_ssh_host_that_cannot_sandbox_saying_why(tmp_path: Path, hosts: FakeHosts) -> None:
    await host_run(hosts, "cpu2", HIDE_IP)
    try:
        assert (await host_run(hosts, "cpu2", "command -v ip || echo none")).stdout.strip() == "none"
        async with _server(tmp_path, sandbox="on") as server, server.client() as c:
            await apply_fleet(c, ssh_fleet(hosts, "strict", [hosts.ip("cpu2")]))
            fleet = await wait_for(lambda: fleet_settled(c, "strict", 1), timeout=30)
            inst = fleet["instances"][0]
            assert inst["status"] == "terminated" and inst["termination_reason"] == "error", inst
            message = inst["termination_reason_message"]
            assert "--sandbox on, but jobs cannot get a sandbox here" in message, message
            assert "missing on this host: ip (iproute2)" in message, message
    finally:
        await host_run(hosts, "cpu2", SHOW_IP)
