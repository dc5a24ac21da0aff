"""A service through both CLIs against a real ``corral server`` (sandboxed local replicas): the official
dstack 0.22.5 ``apply -d`` submits it and ``ps`` shows its replicas and probes; ``corral apply -d`` prints
the URL it is published at and ``corral ps`` each replica's readiness; the URL answers through the proxy."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from dstack_client_env import CorralServer, DstackCli, cli_env, corral_server, short_home

from skip_policy import needs_root

pytestmark = needs_root("the job sandbox needs root (CI runs as root)")
TOKEN = "e2e-services-token-0123456789"
RESOURCES = "resources:\n  cpu: 1..\n  memory: 0.1GB..\n  disk: 1GB..\n"
APP = (
    "import http.server, os\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = os.environ['DSTACK_JOB_ID'].encode()\n"
    "        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers()\n"
    "        self.wfile.write(body)\n"
    "http.server.ThreadingHTTPServer(('0.0.0.0', 8000), H).serve_forever()\n"
)


def service_yaml(name: str) -> str:
    app = base64.b64encode(APP.encode()).decode()
    return (
        f"type: service\nname: {name}\nport: 8000\nreplicas: 2\n"
        "probes:\n  - type: http\n    url: /\n    interval: 1s\n"
        f"commands:\n  - echo {app} | base64 -d > app.py\n  - python3 app.py\n{RESOURCES}"
    )


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("svc-e2e")


@pytest.fixture(scope="module")
def server(tmp: Path) -> Iterator[CorralServer]:
    with corral_server(tmp, TOKEN, CORRAL_SANDBOX="on") as s:
        r = s.api(
            "/api/project/main/fleets/apply",
            {
                "force": False,
                "plan": {
                    "spec": {
                        "configuration": {"type": "fleet", "name": "fl", "nodes": "0..4", "resources": {"cpu": "1.."}},
                        "profile": {},
                    }
                },
            },
        )
        assert r.status_code == 200, r.text
        yield s


@pytest.fixture(scope="module")
def dstack(dstack_venv: Path, server: CorralServer, tmp: Path) -> Iterator[DstackCli]:
    (tmp / "work").mkdir()
    with short_home() as home:
        cli = DstackCli(dstack_venv, home, tmp / "work", server)
        cli.ok("project", "add", "--name", "main", "--url", server.url, "--token", TOKEN, "-y")
        yield cli


def corral(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CORRAL_CONFIG_DIR": str(tmp / "corral-config"), "COLUMNS": "200"}
    env = {k: v for k, v in env.items() if k != "CORRAL_SERVER_DIR"}
    out = subprocess.run(
        [sys.executable, "-m", "corral.cli.main", *args], env=env, capture_output=True, text=True, timeout=90
    )
    assert out.returncode == 0 and "Traceback" not in out.stderr, f"corral {args}: {out.stdout}\n{out.stderr}"
    return out


def wait_ready(server: CorralServer, name: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        run = server.api("/api/project/main/runs/get", {"run_name": name}).json()
        subs = [j["job_submissions"][-1] for j in run["jobs"]]
        if len(subs) == 2 and all(s.get("corral_ready") for s in subs):
            return dict(run)
        assert time.monotonic() < deadline, f"{name} not ready: {[s['status'] for s in subs]}\n{server.log_tail()}"
        time.sleep(0.3)


def test_official_client_applies_a_service_and_ps_shows_its_replicas(dstack: DstackCli) -> None:
    dstack.write("svc.dstack.yml", service_yaml("svc-d"))
    res = dstack.ok("apply", "-f", "svc.dstack.yml", "-y", "-d")
    assert "Run svc-d submitted, detaching" in res.output, dstack.explain(res)
    assert "service" in res.output, dstack.explain(res)
    run = wait_ready(dstack.server, "svc-d")
    res = dstack.ok("ps", "-v")
    lines = res.stdout.splitlines()
    replicas = [line for line in lines if "replica=" in line]
    assert len(replicas) == 2 and all("running" in line and "✓" in line for line in replicas), dstack.explain(res)
    data = json.loads(dstack.ok("ps", "--json").stdout)
    (shown,) = [r for r in data["runs"] if r["run_spec"]["run_name"] == "svc-d"]
    assert shown["service"]["url"] == "/proxy/services/main/svc-d/"
    ids = {j["job_submissions"][-1]["id"] for j in run["jobs"]}
    got = {
        httpx.get(dstack.server.url + "/proxy/services/main/svc-d/", headers={"Authorization": f"Bearer {TOKEN}"}).text
        for _ in range(6)
    }
    assert got == ids
    dstack.ok("stop", "svc-d", "-y")


def test_attached_official_apply_of_a_service_streams_its_output_and_ctrl_c_detaches(dstack: DstackCli) -> None:
    first = "  - echo serving-now-from-$DSTACK_JOB_ID\n"
    yaml = service_yaml("svc-a").replace("  - python3 app.py", first + "  - python3 app.py")
    dstack.write("svc-a.dstack.yml", yaml)
    proc = subprocess.Popen(
        [str(dstack.venv / "bin" / "dstack"), "apply", "-f", "svc-a.dstack.yml", "-y"], cwd=dstack.workdir,
        env=cli_env(dstack.home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stdout:  # attached: the replica's output comes over corral's SSH endpoint
            lines.append(line)
            if "serving-now-from-" in line:
                break
        out = "".join(lines)
        assert "serving-now-from-" in out, out
        assert "/proxy/services/main/svc-a/" in out, out  # the CLI prints where the service is published
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rest, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            rest, _ = proc.communicate()
    assert "Detached" in rest, "".join(lines) + rest
    assert dstack.server.api("/api/project/main/runs/get", {"run_name": "svc-a"}).json()["status"] == "running"
    dstack.ok("stop", "svc-a", "-y")


def test_corral_apply_prints_the_url_and_ps_the_readiness(server: CorralServer, tmp: Path) -> None:
    (tmp / "svc.dstack.yml").write_text(service_yaml("svc-c"))
    out = corral(tmp, "apply", "-f", str(tmp / "svc.dstack.yml"), "-y", "-d").stdout
    url = f"{server.url}/proxy/services/main/svc-c/"
    assert "Run svc-c submitted, detaching" in out and url in out, out
    wait_ready(server, "svc-c")
    ps = corral(tmp, "ps").stdout
    rows = [line for line in ps.splitlines() if "replica=" in line]
    assert len(rows) == 2 and all("(ready)" in row for row in rows), ps
    assert httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    corral(tmp, "stop", "svc-c", "-y")


def test_the_server_takes_websocket_upgrades_without_loading_them_at_start(server: CorralServer) -> None:
    import socket as sock

    host, port = server.url.removeprefix("http://").split(":")
    with sock.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(
            b"GET /proxy/services/main/nosuch/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        head = s.recv(4096)
    # a WebSocket handshake the proxy refuses (no such service): 403, not an HTTP answer to a plain GET
    assert head.startswith(b"HTTP/1.1 403"), head
    assert "Unsupported upgrade" not in server.log_tail(200)
