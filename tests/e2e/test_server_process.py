"""``corral server`` as a process: it binds its port before it announces anything or writes the CLI's
configuration (a taken port is a clear error and nothing is written), and it logs what happens -- one line
per event, JSON with ``CORRAL_LOG_FORMAT=json``, an access log with ``--access-log`` and a shutdown line."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from dstack_client_env import _corral_command, agent_pids_under, free_port

from server_harness import fleet_body, task_body


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(
        HOME=str(tmp / "home"),
        CORRAL_SERVER_DIR=str(tmp / "server"),
        CORRAL_CONFIG_DIR=str(tmp / "cli"),
        PYTHONUNBUFFERED="1",
        **extra,
    )
    (tmp / "home").mkdir(exist_ok=True)
    return env


def test_a_taken_port_is_a_clear_error_and_nothing_is_written(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [*_corral_command(), "server"],
            env=_env(tmp_path, CORRAL_SERVER_PORT=str(port)),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"Error: Port {port} is already in use on 127.0.0.1" in proc.stderr
    assert f"--port {port + 1}" in proc.stderr and "Traceback" not in proc.stderr
    assert "running at" not in proc.stdout and "admin token" not in proc.stdout
    assert not (tmp_path / "cli" / "config.yml").exists()
    assert not (tmp_path / "server").exists()  # no database, no lock, nothing


def _post(url: str, token: str, path: str, body: Any = None) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body or {}, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def test_json_logs_name_each_event_then_a_clean_shutdown(tmp_path: Path) -> None:
    port = free_port()
    env = _env(
        tmp_path,
        CORRAL_LOG_FORMAT="json",
        CORRAL_SERVER_ADMIN_TOKEN="tok",
        CORRAL_PROVISIONING_TIMEOUT="30",
        CORRAL_DEFAULT_STOP_DURATION="5",
        CORRAL_INSTANCE_CHECK_INTERVAL="0.3",
        # Every warning on (as ``python -W default``): a dependency's warning must come out as a JSON record
        # too, or not at all (asyncssh, imported when the job's SSH endpoint starts, warns about DSA at import).
        PYTHONWARNINGS="default",
    )
    err_path = tmp_path / "server.err"
    with open(err_path, "wb") as err, open(tmp_path / "server.out", "wb") as out:
        proc = subprocess.Popen(
            [*_corral_command(), "server", "--port", str(port), "--access-log"],
            env=env,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, err_path.read_text()
            try:
                if httpx.get(f"{url}/healthcheck", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, err_path.read_text()
            time.sleep(0.1)
        assert f"running at {url}" in (tmp_path / "server.out").read_text()
        assert _post(url, "tok", "/api/project/main/fleets/apply", fleet_body(name="logs-fleet")).status_code == 200
        assert _post(url, "tok", "/api/project/main/runs/apply", task_body(["echo hi"], name="logged")).is_success
        assert _post(url, "wrong", "/api/runs/list").status_code == 403  # an unknown token, as dstack
        assert _post(url, "tok", "/api/project/main/runs/get", {"run_name": "nope"}).status_code == 400
        proxied = httpx.get(f"{url}/proxy/services/main/no-such-service/", headers={"Authorization": "Bearer tok"})
        assert proxied.status_code == 404, proxied.text
        deadline = time.monotonic() + 60
        while True:
            run = _post(url, "tok", "/api/project/main/runs/get", {"run_name": "logged"}).json()
            if run["status"] in ("done", "failed", "terminated"):
                break
            assert time.monotonic() < deadline, run
            time.sleep(0.2)
        assert run["status"] == "done", run
        for pid in agent_pids_under(tmp_path):  # the instance's agent dies: the server says it lost it
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while '"instance_lost"' not in err_path.read_text():
            assert time.monotonic() < deadline, err_path.read_text()
            time.sleep(0.2)
        _post(url, "tok", "/api/project/main/fleets/delete", {"names": ["logs-fleet"]})
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, err_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pid in agent_pids_under(tmp_path):
            os.kill(pid, signal.SIGKILL)
    lines = [line for line in err_path.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert not [r for r in records if "DSA" in r["message"]], "the known asyncssh warning is filtered"
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    events: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        events.setdefault(str(r.get("event")), []).append(r)
    assert events["run_submitted"][0]["run_name"] == "logged"
    placed = events["job_placed"][0]
    assert placed["run_name"] == "logged" and placed["fleet"] == "logs-fleet", placed
    assert any(r["fleet"] == "logs-fleet" for r in events["instance_provisioned"])
    lost = events["instance_lost"][0]
    assert lost["level"] == "warning" and lost["fleet"] == "logs-fleet" and "unreachable" in lost["message"]
    finished = [r for r in events["run_finished"] if r["run_name"] == "logged"]
    assert finished and finished[0]["status"] == "done" and finished[0]["message"].startswith("run logged finished")
    refused = {(r["path"], r["status"]) for r in events["request_rejected"]}
    assert ("/api/runs/list", 403) in refused and ("/api/project/main/runs/get", 400) in refused
    access = {(r["method"], r["path"], r["status"]) for r in events["request"]}
    assert ("POST", "/api/project/main/runs/apply", 200) in access and ("GET", "/healthcheck", 200) in access
    assert ("GET", "/proxy/services/main/no-such-service/", 404) in access  # proxied requests are logged too
    assert records[-1]["event"] == "server_stopped" and records[-1]["level"] == "info"
    assert all(r["level"] in ("info", "warning") for r in records), [r for r in records if r["level"] == "error"]


def test_an_unknown_log_format_is_refused_before_start(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*_corral_command(), "server", "--port", str(free_port())],
        env=_env(tmp_path, CORRAL_LOG_FORMAT="xml"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Error: CORRAL_LOG_FORMAT='xml': use one of text, json" in proc.stderr
    assert "Traceback" not in proc.stderr


def _start_and_stop(tmp: Path, port: int, while_serving: Callable[[int], None] | None = None) -> str:
    """The output of a server started and stopped; ``while_serving(pid)`` is called once it serves."""
    proc = subprocess.Popen(
        [*_corral_command(), "server", "--port", str(port)],
        env=_env(tmp, CORRAL_BACKGROUND_PROCESSING="0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthcheck", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.1)
        if while_serving is not None:
            while_serving(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=30)[0]
    return out


def test_a_start_on_another_port_points_the_cli_there(tmp_path: Path) -> None:
    first, second = free_port(), free_port()
    out = _start_and_stop(tmp_path, first)
    assert "Configured the main project" in out
    config = tmp_path / "cli" / "config.yml"
    assert f"url: http://127.0.0.1:{first}\n" in config.read_text()
    maps: list[str] = []
    out = _start_and_stop(tmp_path, second, lambda pid: maps.append(Path(f"/proc/{pid}/maps").read_text()))
    assert f"Pointed the CLI's projects of this server at http://127.0.0.1:{second}" in out
    assert f"url: http://127.0.0.1:{second}\n" in config.read_text()
    assert f":{first}" not in config.read_text()
    # the admin's token is told by its hash, not decrypted: a start over existing state loads no cryptography
    # (its AES-GCM is about 7 MiB of an idle server's memory)
    assert "cryptography/hazmat/bindings" not in maps[0]
    out = _start_and_stop(tmp_path, second)  # the same port again: nothing to do
    assert "Pointed" not in out and "Configured" not in out


def _healthcheck(conn: socket.socket) -> bytes:
    """One kept-alive ``GET /healthcheck`` on ``conn``: the reply's status line, or ``b""`` where the server
    had closed the connection."""
    try:
        conn.sendall(b"GET /healthcheck HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        reply = conn.recv(65536)
    except (BrokenPipeError, ConnectionResetError):
        return b""
    return reply.split(b"\r\n", 1)[0]


def test_an_idle_kept_alive_connection_outlives_a_clients_own_expiry(tmp_path: Path) -> None:
    """A client that comes back to its kept-alive connection after 6 s (past httpx's 5 s idle expiry and
    uvicorn's default 5 s keep-alive) is answered on it: the server does not close under a client that could
    be sending at that moment."""
    port = free_port()
    replies: list[bytes] = []

    def idle_then_ask(_pid: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            replies.append(_healthcheck(conn))
            time.sleep(6.0)
            replies.append(_healthcheck(conn))

    _start_and_stop(tmp_path, port, idle_then_ask)
    assert replies == [b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK"]
