"""A gateway end to end, everything real: ``corral server`` as a process, the official dstack 0.22.5 CLI, pebble
and pebble-challtestsrv answering ``*.<domain>`` with a fake SSH host's address (``pebble_harness``), the gateway on
that host (an SSH fleet of one), a service (an OpenAI-style model service, the proxy tests' replica app) on the
local fleet.

``dstack apply`` of the gateway waits until it runs; the attached ``dstack apply`` of the service prints
``https://<run>.<domain>``; that URL answers over TLS verified against pebble's root only (the system store refuses
it), 403 without a token, 429 past its rate limit; the model endpoint streams a chat completion at
``https://gateway.<domain>/chat/completions`` and ``/v1/chat/completions``; a restarted server still serves it;
``dstack gateway delete`` closes ports 80/443 and gives the host back to jobs."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from dstack_client_env import CorralServer, DstackCli, cli_env, corral_server, short_home

import gateway_client
from fakehosts import FakeHosts, HostSpec
from pebble_harness import PebbleLab

TOKEN = "e2e-gateway-admin-token-0123456789"
DOMAIN = "gw.example.test"
APP = base64.b64encode((Path(__file__).parent.parent / "proxy" / "replica_app.py").read_bytes()).decode()


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHosts]:
    if os.geteuid() != 0:
        pytest.fail("the gateway end-to-end test needs root (network namespaces, ports 80/443); CI runs it as root")
    fh = FakeHosts({"gwhost": HostSpec()}, tmp_path_factory.mktemp("gw-e2e-hosts")).start()
    try:
        yield fh
    finally:
        fh.stop()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PebbleLab]:
    pebble = PebbleLab(tmp_path_factory.mktemp("gw-e2e-pebble")).start()
    try:
        yield pebble
    finally:
        pebble.stop()


def _open(ip: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((ip, port)) == 0


def _wait(condition: Callable[[], object], server: CorralServer, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.3)


def _get(ip: str, host: str, path: str, root: Path | None, **kw: object) -> gateway_client.Answer:
    return asyncio.run(gateway_client.request(ip, host, path, cafile=str(root) if root else None, **kw))  # type: ignore[arg-type]


def _answers(ip: str, host: str, root: Path) -> bool:
    with contextlib.suppress(OSError, ssl.SSLError, asyncio.TimeoutError):
        return _get(ip, host, "/whoami", root, headers={"Authorization": f"Bearer {TOKEN}"}).status == 200
    return False


def _edge_statuses(server: CorralServer) -> list[str]:
    fleet = server.api("/api/project/main/fleets/get", {"name": "edge"}).json()
    return [str(i["status"]) for i in fleet["instances"]]


def _server_env(lab: PebbleLab) -> dict[str, str]:
    return {
        "CORRAL_SANDBOX": "on",
        "CORRAL_ACME_SERVER": lab.directory_url,
        "CORRAL_ACME_CA_BUNDLE": str(lab.ca_bundle),
        "CORRAL_SAFETY_NET_INTERVAL": "1",
        "CORRAL_PROVISIONING_TIMEOUT": "20",
        "CORRAL_INSTANCE_CHECK_INTERVAL": "1",
    }


def _published_url(cli: DstackCli) -> str:
    """The attached ``dstack apply`` of the service, until it prints where the service is published (then
    Ctrl-C: it detaches, the service goes on)."""
    proc = subprocess.Popen(
        [str(cli.venv / "bin" / "dstack"), "apply", "-f", "svc.dstack.yml", "-y"], cwd=cli.workdir,
        env=cli_env(cli.home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if f"https://svc.{DOMAIN}" in line:
                return line.strip()
        raise AssertionError("".join(lines) + cli.server.log_tail())
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_a_gateway_with_the_official_client(
    dstack_venv: Path, hosts: FakeHosts, lab: PebbleLab, tmp_path: Path
) -> None:
    ip = hosts.ip("gwhost")
    lab.set_default_ipv4(ip)  # *.gw.example.test -> the gateway's host
    root = tmp_path / "pebble-root.pem"
    root.write_text(lab.root_pem())
    host = f"svc.{DOMAIN}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    first = tmp_path / "first"
    first.mkdir()
    with corral_server(first, TOKEN, **_server_env(lab)) as server, short_home() as home:
        (first / "work").mkdir()
        cli = DstackCli(dstack_venv, home, first / "work", server)
        cli.ok("project", "add", "--name", "main", "--url", server.url, "--token", TOKEN, "-y")
        cli.write("local.dstack.yml", "type: fleet\nname: local\nnodes: 0..2\nresources:\n  cpu: 1..\n")
        cli.ok("apply", "-f", "local.dstack.yml", "-y", timeout=120)
        cli.write(
            "edge.dstack.yml",
            f"type: fleet\nname: edge\nssh_config:\n  user: root\n  identity_file: {hosts.key}\n  hosts:\n    - {ip}\n",
        )
        cli.ok("apply", "-f", "edge.dstack.yml", "-y", timeout=180)
        _wait(lambda: _edge_statuses(server) == ["idle"], server)

        cli.write(
            "gateway.dstack.yml",
            f"type: gateway\nname: gw\nbackend: remote\nregion: edge\ndomain: {DOMAIN}\n",
        )
        res = cli.ok("apply", "-f", "gateway.dstack.yml", "-y", timeout=180)  # waits until it runs
        assert "running" in res.stdout, cli.explain(res)
        assert _open(ip, 80) and _open(ip, 443)

        cli.write(
            "svc.dstack.yml",
            "type: service\nname: svc\nport: 8000\nmodel: org/m\ngateway: gw\nfleets: [local]\n"
            "env:\n  - MODEL=org/m\n"
            f"commands:\n  - echo {APP} | base64 -d > app.py\n  - exec python3 app.py 8000\n"
            "probes:\n  - type: http\n    url: /health\n    interval: 1s\n"
            "rate_limits:\n  - prefix: /limited\n    rps: 0.017\n"
            "resources:\n  cpu: 1..\n  memory: 0.1GB..\n  disk: 1GB..\n",
        )
        line = _published_url(cli)
        assert line.endswith(f"https://{host}") or f"https://{host}" in line, line
        _wait(lambda: _answers(ip, host, root), server, timeout=90)

        assert _get(ip, host, "/whoami", root).status == 403  # no token
        with pytest.raises(ssl.SSLCertVerificationError):
            _get(ip, host, "/whoami", None)  # the system store refuses pebble's root
        limited = [_get(ip, host, "/limited", root, headers=auth).status for _ in range(3)]
        assert limited[0] != 429 and limited[1:] == [429, 429], limited

        chat = {"model": "org/m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        for path in ("/chat/completions", "/v1/chat/completions"):
            got = _get(
                ip, f"gateway.{DOMAIN}", path, root, method="POST", body=json.dumps(chat).encode(),
                headers={**auth, "Content-Type": "application/json"}, timeout=60,
            )  # fmt: skip
            assert got.status == 200, got
            events = [x for x in got.body.decode().splitlines() if x.startswith("data: ")]
            assert events[-1] == "data: [DONE]" and "org/m" in events[-2], events

        # the server restarts: the gateway is reached again and still serves the service
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(30)
        second = tmp_path / "second"
        second.mkdir()
        env = {**_server_env(lab), "CORRAL_SERVER_DIR": str(server.server_dir)}
        with corral_server(second, TOKEN, **env) as again:
            _wait(lambda: _answers(ip, host, root), again, timeout=60)
            cli.server = again
            cli.ok("project", "add", "--name", "main", "--url", again.url, "--token", TOKEN, "-y")
            cli.ok("stop", "svc", "-y", timeout=60)
            res = cli.ok("gateway", "delete", "gw", "-y", timeout=120)
            _wait(lambda: again.api("/api/project/main/gateways/get", {"name": "gw"}).status_code == 400, again)
            assert not _open(ip, 80) and not _open(ip, 443)
            _wait(lambda: _edge_statuses(again) == ["idle"], again)  # the host is offered to jobs again
            log = again.log_path.read_text(errors="replace") + server.log_path.read_text(errors="replace")
            assert "Traceback" not in log, again.log_tail(200)
