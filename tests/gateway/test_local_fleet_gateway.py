"""A gateway on a local fleet's instance, run for real: the server starts the gateway's process on its own machine,
gets its certificate from a private ACME CA (pebble, DNS by pebble-challtestsrv) by HTTP-01, and serves a service
(``gateway: gw``) at ``https://<run>.<domain>``, verified against pebble's root only. The held instance gets no job
while the gateway exists; a restarted server finds the process again (the same pid) and registers the service
again; a port already taken is the gateway's ``failed`` status and an event naming the port; deleting the gateway
closes its ports and gives the instance back to jobs. A process that died is started again by the next pass; a
port this server's user may not bind is refused naming it.

Which ports: in production the gateway takes ports 80 and 443 of the server's machine. Here the server runs
in-process beside other tests on the same machine, so it must not take the machine's real 80/443. Two ways were
weighed: the server as a process inside a network namespace of its own, or the documented settings
``CORRAL_LOCAL_GATEWAY_HTTP_PORT``/``_HTTPS_PORT`` with pebble's ``httpPort`` pointed at the test's port. The second
is used: it is what an operator does whose server may not take 80/443 (a forward from 80 and 443 to the gateway's
ports, which pebble's ``httpPort`` stands in for: a public CA validates on port 80), it keeps the in-process server
(no second harness), and the namespace would still exercise no code path the settings do not (the ports are passed
to the gateway process as its ``--http``/``--https``, the same flags an SSH host's gateway gets).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import socket
import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import gateway_client
from corral.backends.gateway_local import port_problem
from corral.settings import Settings, SettingsError
from pebble_harness import PebbleLab
from server_harness import fleet_body, get_run, make_settings, running_server, task_body, wait_for

G = "/api/project/main/gateways"
DOMAIN = "lgw.example.test"
APP = base64.b64encode((Path(__file__).parent.parent / "proxy" / "replica_app.py").read_bytes()).decode()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ports() -> tuple[int, int]:
    """The ports the local gateway takes instead of 80 and 443 (free on every address of this machine)."""
    return _free_port(), _free_port()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, ports: tuple[int, int]) -> Iterator[PebbleLab]:
    pebble = PebbleLab(tmp_path_factory.mktemp("pebble-local-gw"), http_port=ports[0]).start()
    try:
        yield pebble
    finally:
        pebble.stop()


def _kill_left_gateways(server_dir: Path) -> None:
    """Gateway processes a failed test left running (they outlive the server, as in production)."""
    for pid_file in (server_dir / "gateways").glob("*/gateway.pid"):
        with contextlib.suppress(ValueError, OSError):
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)


def _open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


async def _gateway(c: httpx.AsyncClient, name: str) -> dict[str, Any] | None:
    r = await c.post(G + "/get", json={"name": name})
    return dict(r.json()) if r.status_code == 200 else None


async def _gateway_is(c: httpx.AsyncClient, name: str, status: str) -> dict[str, Any] | None:
    g = await _gateway(c, name)
    if g is not None and g["status"] == "failed" and status != "failed":
        raise AssertionError(f"the gateway failed: {g['status_message']}")
    return g if g is not None and g["status"] == status else None


async def _gone(c: httpx.AsyncClient, name: str) -> bool:
    return await _gateway(c, name) is None


async def _edge(c: httpx.AsyncClient) -> list[dict[str, Any]]:
    r = await c.post("/api/project/main/fleets/get", json={"name": "edge"})
    assert r.status_code == 200, r.text
    return list(r.json()["instances"])


async def _edge_is(c: httpx.AsyncClient, status: str) -> bool:
    return [i["status"] for i in await _edge(c)] == [status]


async def _served(port: int, host: str, root: Path, token: str) -> gateway_client.Answer | None:
    with contextlib.suppress(OSError, ssl.SSLError, asyncio.TimeoutError):
        got = await gateway_client.request(
            "127.0.0.1", host, "/whoami", cafile=str(root), port=port, headers={"Authorization": f"Bearer {token}"}
        )
        return got if got.status == 200 else None
    return None


async def _apply_gateway(c: httpx.AsyncClient, name: str) -> None:
    conf = {"type": "gateway", "name": name, "backend": "remote", "region": "edge", "domain": DOMAIN}
    r = await c.post(G + "/apply", json={"plan": {"spec": {"configuration": conf}}, "force": False})
    assert r.status_code == 200, r.text


async def _start_service(c: httpx.AsyncClient) -> None:
    conf = {
        "type": "service", "name": "svc", "port": 8000, "gateway": "gw", "fleets": ["work"],
        "commands": [f"echo {APP} | base64 -d > app.py", "exec python3 app.py 8000"],
        "resources": {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."},
    }  # fmt: skip
    r = await c.post(
        "/api/project/main/runs/apply", json={"force": False, "plan": {"run_spec": {"configuration": conf}}}
    )
    assert r.status_code == 200, r.text


def _withdraw_svc(gw_dir: Path) -> None:
    """Withdraw ``main/svc`` from the gateway through its management API (as the server would)."""
    token, port = (gw_dir / "token").read_text().strip(), (gw_dir / "gateway.port").read_text().strip()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/services/main/svc", method="DELETE", headers={"Authorization": f"Bearer {token}"}
    )
    urllib.request.urlopen(req, timeout=5).read()


@pytest.fixture
def settings_(tmp_path: Path, lab: PebbleLab, ports: tuple[int, int]) -> Iterator[Any]:
    settings = make_settings(
        tmp_path,
        safety_net_interval=1.0,
        provisioning_timeout=20.0,
        acme_server=lab.directory_url,
        acme_ca_bundle=lab.ca_bundle,
        sandbox="on",  # the replica in a network namespace of its own: its port 8000 is not this machine's
        local_gateway_http_port=ports[0],
        local_gateway_https_port=ports[1],
    )
    try:
        yield settings
    finally:
        _kill_left_gateways(settings.server_dir)


async def test_a_gateway_on_a_local_fleet(
    settings_: Any, lab: PebbleLab, ports: tuple[int, int], tmp_path: Path
) -> None:
    http, https = ports
    lab.set_default_ipv4(lab.bridge_ip)  # *.lgw.example.test -> this machine (the bridge's address is its own)
    root = tmp_path / "pebble-root.pem"
    root.write_text(lab.root_pem())
    host = f"svc.{DOMAIN}"
    async with running_server(settings_, keep_agents=True) as s, s.client() as c:
        token = s.token
        for body in (fleet_body(name="edge", nodes="1"), fleet_body(name="work", nodes="0..2")):
            r = await c.post("/api/project/main/fleets/apply", json=body)
            assert r.status_code == 200, r.text
        await wait_for(lambda: _edge_is(c, "idle"), timeout=60, interval=0.3)
        await _apply_gateway(c, "gw")
        gw = await wait_for(lambda: _gateway_is(c, "gw", "running"), timeout=60, interval=0.3)
        assert _open(http) and _open(https)
        assert gw["replicas"][0]["backend"] == "remote" and gw["replicas"][0]["region"] == "edge", gw
        # the held instance is busy and gets no job: a task for its fleet waits
        assert await _edge_is(c, "busy")
        waiter_body = task_body(["echo placed"], name="waiter", fleets=["edge"])
        r = await c.post("/api/project/main/runs/apply", json=waiter_body)
        assert r.status_code == 200, r.text

        await _start_service(c)
        run = await get_run(c, "svc")
        assert run["service"]["url"] == f"https://{host}", run["service"]
        await wait_for(lambda: _served(https, host, root, token), timeout=90, interval=0.5)
        with pytest.raises(ssl.SSLCertVerificationError):  # the system store refuses pebble's root
            await gateway_client.request("127.0.0.1", host, "/whoami", cafile=None, port=https)
        plain = await gateway_client.request("127.0.0.1", host, "/whoami", cafile=None, port=http, tls=False)
        assert plain.status == 301, plain
        waiter = await get_run(c, "waiter")
        placed = waiter["jobs"][0]["job_submissions"][-1].get("job_provisioning_data")
        assert waiter["status"] == "submitted" and placed is None, waiter
        gw_dir = s.settings.server_dir / "gateways" / gw["id"]
        pid = (gw_dir / "gateway.pid").read_text()

    # the server stops, the gateway goes on (its pid unchanged); it forgets the service meanwhile ...
    assert _open(https) and os.path.exists(f"/proc/{pid}")
    _withdraw_svc(gw_dir)
    assert await _served(https, host, root, token) is None
    async with running_server(settings_) as s, s.client() as c:
        # ... and the restarted server finds the same process and registers the service again
        await wait_for(lambda: _served(https, host, root, token), timeout=60, interval=0.5)
        assert (gw_dir / "gateway.pid").read_text() == pid
        assert (await get_run(c, "waiter"))["status"] == "submitted"
        # the process dies: the next pass starts it again, and it serves what it kept
        os.kill(int(pid), signal.SIGKILL)
        await wait_for(lambda: _restarted(gw_dir, pid), timeout=30, interval=0.3)
        await wait_for(lambda: _served(https, host, root, token), timeout=30, interval=0.5)
        pid = (gw_dir / "gateway.pid").read_text()

        r = await c.post("/api/project/main/runs/stop", json={"runs_names": ["svc"], "abort": False})
        assert r.status_code == 200, r.text
        await wait_for(lambda: _deleted(c, "gw"), timeout=60, interval=0.5)
        await wait_for(lambda: _gone(c, "gw"), timeout=60, interval=0.3)
        assert not _open(http) and not _open(https)
        assert not gw_dir.exists(), gw_dir
        assert not os.path.exists(f"/proc/{pid}"), Path(f"/proc/{pid}/stat").read_text()
        # the instance is the fleet's again: the waiting task runs there
        done = await wait_for(lambda: _finished(c, "waiter"), timeout=60, interval=0.3)
        assert done["status"] == "done", done

        # a port already taken: the gateway fails, naming the port, and nothing else breaks
        with socket.socket() as squatter:
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind(("127.0.0.1", https))
            squatter.listen()
            await wait_for(lambda: _edge_is(c, "idle"), timeout=30, interval=0.3)
            await _apply_gateway(c, "gw2")
            failed = await wait_for(lambda: _gateway_is(c, "gw2", "failed"), timeout=60, interval=0.3)
            assert f"port {https} of this machine is taken" in failed["status_message"], failed
            assert "CORRAL_LOCAL_GATEWAY_HTTPS_PORT" in failed["status_message"], failed
            r = await c.post("/api/events/list", json={"target_gateways": [failed["id"]], "ascending": True})
            assert any(f"port {https}" in e["message"] for e in r.json()), r.json()
            assert not _open(http)
        r = await c.post(G + "/delete", json={"names": ["gw2"]})
        assert r.status_code == 200, r.text
        await wait_for(lambda: _gone(c, "gw2"), timeout=60, interval=0.3)
        await wait_for(lambda: _edge_is(c, "idle"), timeout=30, interval=0.3)


async def _restarted(gw_dir: Path, old_pid: str) -> bool:
    with contextlib.suppress(OSError):
        return (gw_dir / "gateway.pid").read_text() != old_pid and (gw_dir / "gateway.port").exists()
    return False


async def _deleted(c: httpx.AsyncClient, name: str) -> bool:
    """Delete the gateway once no service is published on it any more (the stopped service is withdrawn)."""
    r = await c.post(G + "/delete", json={"names": [name]})
    return r.status_code == 200


async def _finished(c: httpx.AsyncClient, name: str) -> dict[str, Any] | None:
    run = await get_run(c, name)
    return run if run["status"] in ("done", "failed", "terminated") else None


def test_the_local_gateways_ports_are_settings() -> None:
    s = Settings.from_env({"CORRAL_LOCAL_GATEWAY_HTTP_PORT": "8080", "CORRAL_LOCAL_GATEWAY_HTTPS_PORT": "8443"})
    assert (s.local_gateway_http_port, s.local_gateway_https_port) == (8080, 8443)
    assert (Settings.from_env({}).local_gateway_http_port, Settings.from_env({}).local_gateway_https_port) == (80, 443)
    for env, words in (
        ({"CORRAL_LOCAL_GATEWAY_HTTP_PORT": "http"}, "CORRAL_LOCAL_GATEWAY_HTTP_PORT='http' must be a port number"),
        ({"CORRAL_LOCAL_GATEWAY_HTTPS_PORT": "70000"}, "CORRAL_LOCAL_GATEWAY_HTTPS_PORT='70000' must be a port"),
        ({"CORRAL_LOCAL_GATEWAY_HTTPS_PORT": "80"}, "are both 80: give them different ports"),
    ):
        with pytest.raises(SettingsError) as e:
            Settings.from_env(env)
        assert words in str(e.value), e.value


def test_a_port_the_servers_user_may_not_bind_is_named() -> None:
    """Port 80 as an unprivileged user (nobody, in a forked child): the reason, the port and the fixes, in words."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, try the port, report, exit
        try:
            os.setuid(65534)
            os.write(write, str(port_problem("0.0.0.0", 80, "SETTING")).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        said = f.read()
    os.waitpid(pid, 0)
    assert said.startswith("port 80 of this machine needs root (or CAP_NET_BIND_SERVICE)"), said
    assert "(uid 65534)" in said and "move the gateway's port with SETTING" in said, said
