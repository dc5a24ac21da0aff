"""The agent's connections: idle ones time out, handler threads are bounded, long polls are not cut,
``/health`` says nothing without the token, a 403 closes the connection, and connections made together
wait to be accepted."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.agent.server import Agent

TOKEN = "conn-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _serve(agent: Agent) -> threading.Thread:
    t = threading.Thread(target=agent.serve_forever, daemon=True)
    t.start()
    return t


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    """An agent whose connections may stay silent for half a second, three at once."""
    a = Agent(str(tmp_path / "w"), TOKEN, idle_timeout=0.5, max_connections=3)
    t = _serve(a)
    yield a
    a.runner.shutdown()
    a.httpd.shutdown()
    t.join(10)


def _url(agent: Agent) -> str:
    return f"http://127.0.0.1:{agent.port}"


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _read_response(sock: socket.socket) -> bytes:
    """One whole HTTP response (headers and its Content-Length of body)."""
    sock.settimeout(5.0)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(v) for k, _, v in (h.partition(b": ") for h in head.split(b"\r\n")) if k.lower() == b"content-length"
    )
    while len(body) < length:
        body += sock.recv(4096)
    return head


def test_an_idle_connection_is_closed(agent: Agent) -> None:
    silent = socket.create_connection(("127.0.0.1", agent.port))
    half = socket.create_connection(("127.0.0.1", agent.port))
    half.sendall(b"GET /jobs HTTP/1.1\r\nHost: x\r\n")  # a request that never ends
    started = time.monotonic()
    assert _closed_within(silent, 5.0) and _closed_within(half, 5.0)
    assert time.monotonic() - started < 4.0
    silent.close()
    half.close()
    # a connection kept alive between requests closes the same way, after its last answer
    with socket.create_connection(("127.0.0.1", agent.port)) as keep:
        keep.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_response(keep).startswith(b"HTTP/1.1 200")
        assert _closed_within(keep, 5.0)


def test_a_long_poll_outlives_the_idle_timeout(agent: Agent) -> None:
    with httpx.Client(base_url=_url(agent), headers=AUTH, timeout=20) as c:
        r = c.post("/jobs", json={"job_id": "sleeper", "run_name": "r", "commands": ["sleep 5"]})
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 10
        while c.get("/jobs/sleeper").json()["state"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        offset = c.get("/jobs/sleeper/logs").json()["next_offset"]  # after the agent's own lines about its start
        started = time.monotonic()
        r = c.get("/jobs/sleeper/logs", params={"wait": 2, "state": "running", "offset": offset})
        assert r.status_code == 200 and time.monotonic() - started >= 1.5  # waited 4x the idle timeout
        assert c.get("/jobs/sleeper").status_code == 200  # and the connection still serves


def _handler_threads(server: object) -> int:
    """The request handler threads of ``server`` alone (``Thread-N (process_request_thread)`` bound to it): not
    the other threads of the process, nor the handlers of another test's agent (its keep-alive connections may
    be closing meanwhile)."""
    return sum(
        "process_request_thread" in th.name and getattr(getattr(th, "_target", None), "__self__", None) is server
        for th in threading.enumerate()
    )


def test_handler_threads_are_bounded(tmp_path: Path) -> None:
    agent = Agent(str(tmp_path / "w"), TOKEN, idle_timeout=30, max_connections=3)
    t = _serve(agent)
    holders = [socket.create_connection(("127.0.0.1", agent.port)) for _ in range(3)]
    try:
        for h in holders:  # each holds a handler thread in the middle of a request
            h.sendall(b"GET /health HTTP/1.1\r\n")
        deadline = time.monotonic() + 5
        while _handler_threads(agent.httpd) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        before = _handler_threads(agent.httpd)
        r = httpx.get(_url(agent) + "/health", timeout=10)
        assert r.status_code == 503 and "3 connections" in r.json()["error"]
        assert r.headers["connection"] == "close"
        assert _handler_threads(agent.httpd) <= before  # the fourth got no thread (other threads may come and go)
        holders.pop().close()
        deadline = time.monotonic() + 5
        while True:  # the freed slot serves the next one
            r = httpx.get(_url(agent) + "/health", timeout=10)
            if r.status_code == 200:
                break
            assert time.monotonic() < deadline, r.text
            time.sleep(0.05)
    finally:
        for h in holders:
            h.close()
        agent.httpd.shutdown()
        t.join(10)


def test_health_says_nothing_without_the_token(agent: Agent) -> None:
    anonymous = httpx.get(_url(agent) + "/health")
    assert anonymous.status_code == 200 and anonymous.json() == {"status": "ok"}
    assert anonymous.headers["server"] == "corral-agent"  # no agent or Python version either
    wrong = httpx.get(_url(agent) + "/health", headers={"Authorization": "Bearer nope"})
    assert wrong.json() == {"status": "ok"}
    known = httpx.get(_url(agent) + "/health", headers=AUTH).json()
    assert known["status"] == "ok" and known["protocol_version"] == 1 and "agent_version" in known
    assert "pid" not in known


def test_a_403_closes_the_connection_unread(agent: Agent) -> None:
    with socket.create_connection(("127.0.0.1", agent.port)) as s:
        s.sendall(b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n" + b"x" * 1024)
        head = _read_response(s)
        assert head.startswith(b"HTTP/1.1 403") and b"\r\nConnection: close" in head
        assert _closed_within(s, 5.0)


def test_replies_on_a_kept_alive_connection_are_not_held_back_by_nagle(agent: Agent) -> None:
    """A reply's head and body are two writes: without TCP_NODELAY the body waited for the ACK of the head,
    which the client delays by about 40 ms on Linux -- every call to the agent took 40 ms more than its work.
    Twenty calls on one connection now take a small fraction of the 800 ms that cost them."""
    with socket.create_connection(("127.0.0.1", agent.port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        s.sendall(request)
        assert _read_response(s).startswith(b"HTTP/1.1 200")  # the first one warms the path up
        started = time.monotonic()
        for _ in range(20):
            s.sendall(request)
            assert _read_response(s).startswith(b"HTTP/1.1 200")
        assert time.monotonic() - started < 0.4


def test_connections_made_together_wait_to_be_accepted(tmp_path: Path) -> None:
    """Before the agent accepts any (it is not serving yet), 40 connections made at once all complete: the
    listen backlog holds as many as the agent serves, not socketserver's 5 (past it, Linux drops the SYN and
    the client tries again a second later)."""
    agent = Agent(str(tmp_path / "w"), TOKEN, max_connections=64)
    socks = []
    try:
        for _ in range(40):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", agent.port))
            socks.append(s)
        time.sleep(0.3)
        # a completed handshake makes the socket writable with no error; a dropped SYN leaves it connecting
        pending = []
        for s in socks:
            s.settimeout(0.0)
            try:
                s.send(b"")
            except OSError as e:
                pending.append(e)
        assert not pending, f"{len(pending)} of 40 connections not accepted by the kernel: {pending[:3]}"
    finally:
        for s in socks:
            s.close()
        agent.runner.shutdown()
        agent.httpd.server_close()
