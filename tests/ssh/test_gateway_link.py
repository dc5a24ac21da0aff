"""The server's channel to a gateway's host (``backends.gateway_link``) against a real sshd host and the real
gateway zipapp: uploaded once (content-hashed), started detached with a 0600 token file, adopted by a second
deploy, its management API reached through the local forward, the server reached from the host through the
reverse forward (the same port again after the SSH connection drops), a non-root login refused with the
reason, and ports 80/443 closed once it is removed."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from ssh_harness import host_run

from corral.backends.gateway_api import GatewayApi
from corral.backends.gateway_link import GatewayBuild, GatewayLink
from corral.backends.ssh_conn import SshError, SshTarget
from corral.gateway.zipapp import build_zipapp
from fakehosts import FakeHosts

TOKEN = "gatewaytoken0123456789"


def _open(ip: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((ip, port)) == 0


@pytest.fixture
def build(tmp_path: Path) -> GatewayBuild:
    return GatewayBuild.of(build_zipapp(tmp_path / "corral-gateway.pyz").read_bytes())


@pytest.fixture
async def fake_server() -> AsyncIterator[int]:
    """A stand-in for the server's HTTP port on this machine: answers every request with its path."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        while (await reader.readline()).strip():
            pass
        body = b"server saw " + line.split(b" ")[1]
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()


async def _fetch_on_host(hosts: FakeHosts, url: str) -> str:
    code = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=5).read().decode())"
    return (await host_run(hosts, "cpu1", f"python3 -c {code!r}")).stdout.strip()


async def test_deploy_forward_reconnect_and_remove(hosts: FakeHosts, build: GatewayBuild, fake_server: int) -> None:
    ip = hosts.ip("cpu1")
    link = GatewayLink(SshTarget(ip, 22, "root", hosts.key.read_text()), 5.0, fake_server)
    api = GatewayApi(link.management_url(), TOKEN)
    try:
        first = await link.deploy(build, TOKEN)
        assert first.uploaded and not first.adopted
        assert await api.health()
        assert _open(ip, 80) and _open(ip, 443)
        mode = await host_run(hosts, "cpu1", "stat -c %a ~/.corral-gateway/token")
        assert mode.stdout.strip() == "600"
        ps = await host_run(hosts, "cpu1", "ps -eo args=")
        assert TOKEN not in ps.stdout  # the token is read from its file

        again = await link.deploy(build, TOKEN)  # a retried deploy, a restarted server
        assert again.adopted and not again.uploaded and again.pid == first.pid

        url = await link.server_url()
        assert await _fetch_on_host(hosts, url + "/proxy/x") == "server saw /proxy/x"
        generation = link.generation

        conn = await link.link.connection()
        conn.abort()  # the SSH connection drops
        await asyncio.sleep(0.3)
        assert await link.server_url() == url and link.generation == generation
        assert await _fetch_on_host(hosts, url + "/again") == "server saw /again"
        assert await api.health()  # the local forward reconnects on its own

        # a wrong token is refused by the gateway
        async with httpx.AsyncClient(base_url=link.management_url()) as c:
            assert (await c.get("/api/health", headers={"Authorization": "Bearer wrong"})).status_code == 401

        await link.remove()
        assert not _open(ip, 80) and not _open(ip, 443)
        left = await host_run(hosts, "cpu1", "ls -a ~ | grep -c corral-gateway || true")
        assert left.stdout.strip() == "0"
    finally:
        await api.aclose()
        with contextlib.suppress(SshError):
            await link.remove()
        await link.close()


async def test_a_login_that_cannot_bind_80_and_443_is_told_why(hosts: FakeHosts, build: GatewayBuild) -> None:
    key = Path(f"{hosts.key}.pub").read_text().strip()
    setup = (
        "id gwuser >/dev/null 2>&1 || useradd -m -s /bin/sh gwuser; usermod -p '*' gwuser; mkdir -p ~gwuser/.ssh; "
        f"echo '{key}' > ~gwuser/.ssh/authorized_keys; chown -R gwuser ~gwuser/.ssh; chmod 700 ~gwuser/.ssh"
    )
    assert (await host_run(hosts, "cpu1", setup)).exit_status == 0
    link = GatewayLink(SshTarget(hosts.ip("cpu1"), 22, "gwuser", hosts.key.read_text()), 5.0, 1)
    try:
        with pytest.raises(SshError) as e:
            await link.deploy(build, TOKEN)
        assert e.value.permanent
        assert "needs root" in str(e.value) and "gwuser" in str(e.value), str(e.value)
    finally:
        await host_run(hosts, "cpu1", "pkill -u gwuser; userdel -r gwuser; true")
        await link.close()
