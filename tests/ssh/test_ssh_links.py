"""The SSH link to a host: one handshake shared by every caller (a slow host is reached, not given up on),
a dropped connection made again, and agents that outlive the server's SSH connections (a restarted
server reaches them again through new tunnels, from what the instance row stores)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import asyncssh
import pytest
from ssh_harness import (
    SSH_SETTINGS,
    apply_fleet,
    fleet_settled,
    host_run,
    run_logs,
    run_status,
    ssh_fleet,
    submit,
)

from corral.backends import ssh_bootstrap
from corral.backends.ssh_conn import HostLink, SshError, SshTarget
from fakehosts import FakeHosts, HostSpec
from server_harness import make_settings, running_server, wait_for


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


async def test_slow_handshake_is_shared_and_dropped_connection_remade(hosts: FakeHosts) -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def slow_relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        up_reader, up_writer = await asyncio.open_connection(hosts.ip("cpu1"), 22)
        await asyncio.sleep(2.0)  # a host slow to answer
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    relay = await asyncio.start_server(slow_relay, "127.0.0.1", 0)
    port = relay.sockets[0].getsockname()[1]
    link = HostLink(SshTarget("127.0.0.1", port, "root", hosts.key.read_text()), 10.0, ssh_bootstrap.read_agent_port)
    try:
        with pytest.raises(asyncio.TimeoutError):  # an impatient caller (a health check) gives up...
            await asyncio.wait_for(link.connection(), 0.5)
        result = await link.run("hostname")  # ...but the handshake goes on, and the next caller gets it
        assert result.stdout.strip() == b"cpu1"
        assert len(accepted) == 1
        accepted[0].transport.abort()  # the connection drops
        await asyncio.sleep(0.2)
        with contextlib.suppress(SshError):
            await link.run("true")
        assert (await link.run("hostname")).stdout.strip() == b"cpu1"
        assert len(accepted) == 2
    finally:
        await link.close()
        relay.close()


async def test_agent_outlives_the_server_and_is_reached_again(hosts: FakeHosts, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, **SSH_SETTINGS)
    async with running_server(settings) as s, s.client() as c:
        await apply_fleet(c, ssh_fleet(hosts, "kept", [hosts.ip("cpu1")]))
        await wait_for(lambda: fleet_settled(c, "kept", 1), timeout=30)
        await submit(c, "across", ["echo before", "sleep 4", "echo after"])
        await run_status(c, "across", "running")

        async def started() -> bool:
            return "before" in await run_logs(c, await run_status(c, "across", "running", "done"))

        await wait_for(started)
    # The server and all its SSH connections are gone; the agent and its job are not.
    ps = await host_run(hosts, "cpu1", "ps -eo args=")
    assert "agent.pyz serve" in ps.stdout and "sleep 4" in ps.stdout, ps.stdout
    async with running_server(settings) as s, s.client() as c:
        run = await run_status(c, "across", "done", "failed", timeout=30)
        assert run["status"] == "done", run["latest_job_submission"]
        assert (await run_logs(c, run)).split() == ["before", "after"]
        await submit(c, "next", ["hostname"])
        run = await run_status(c, "next", "done", "failed")
        assert (await run_logs(c, run)).strip() == "cpu1"
        await c.post("/api/project/main/fleets/delete", json={"names": ["kept"]})

        async def gone() -> bool:
            return not (await c.post("/api/project/main/fleets/list", json={})).json()

        await wait_for(gone, timeout=30)
    assert (await host_run(hosts, "cpu1", "ls -d ~/.corral-agent")).exit_status != 0


async def test_a_command_that_ends_before_its_input_is_written_is_answered_not_a_broken_link(
    hosts: FakeHosts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A login shell that runs nothing (``nologin``) exits, and the host closes the channel, at once: on a busy
    machine, before the command's input is written. That is the command's answer (its output and exit status),
    not a broken connection to retry: the host probe says the login cannot run commands. The race is made certain
    here: each session is handed over only once the host has closed it."""
    opened = asyncssh.SSHClientConnection.create_session

    async def closed_first(self: asyncssh.SSHClientConnection, *args: object, **kwargs: object) -> object:
        chan, session = await opened(self, *args, **kwargs)  # type: ignore[arg-type]
        await asyncio.wait_for(chan.wait_closed(), 10)
        return chan, session

    monkeypatch.setattr(asyncssh.SSHClientConnection, "create_session", closed_first)
    target = SshTarget(hosts.ip("cpu2"), 22, "nologin", hosts.key.read_text())
    link = HostLink(target, 10.0, ssh_bootstrap.read_agent_port)
    try:
        for _ in range(3):
            result = await link.run("sh -s", input=ssh_bootstrap.PROBE, timeout=10)
            assert result.exit_status != 0
            assert b"This account is currently not available" in result.stdout + result.stderr
        with pytest.raises(SshError, match="the login works but cannot run commands") as raised:
            await ssh_bootstrap.probe(link)
        assert raised.value.permanent
    finally:
        await link.close()


async def test_the_link_asks_for_aes_gcm_first_and_reaches_a_host_without_it(hosts: FakeHosts) -> None:
    """Every byte to an agent crosses the host's SSH connection: the link asks for AES-GCM (one AEAD call a
    packet in ``cryptography``) ahead of asyncssh's first choice, chacha20-poly1305 (several). OpenSSH's sshd
    offers AES-GCM by default; a host whose sshd allows only chacha20-poly1305 is reached with that."""
    key = hosts.key.read_text()
    link = HostLink(SshTarget(hosts.ip("cpu1"), 22, "root", key), 10.0, ssh_bootstrap.read_agent_port)
    try:
        conn = await link.connection()
        assert (conn.get_extra_info("send_cipher"), conn.get_extra_info("recv_cipher")) == (
            "aes128-gcm@openssh.com",
            "aes128-gcm@openssh.com",
        )
    finally:
        await link.close()
    hosts.add("chac", hosts.unused_ip(), HostSpec(sshd_extra="Ciphers chacha20-poly1305@openssh.com"))
    try:
        link = HostLink(SshTarget(hosts.ip("chac"), 22, "root", key), 10.0, ssh_bootstrap.read_agent_port)
        try:
            assert (await link.run("hostname")).stdout.strip() == b"chac"
            assert (await link.connection()).get_extra_info("send_cipher") == "chacha20-poly1305@openssh.com"
        finally:
            await link.close()
    finally:
        hosts.remove("chac")
