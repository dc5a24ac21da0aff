"""A request's head as the agent reads it (:func:`corral.agent.http_head.read_head`): fields without case, the
first of a name, ``http.client``'s limits, and on the wire the same answers as the standard library's parse gave."""

from __future__ import annotations

import http.client
import io
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.agent.http_head import read_head
from corral.agent.server import Agent

TOKEN = "head-token"


def test_fields_are_found_without_case_and_the_first_of_a_name_wins() -> None:
    head = read_head(
        io.BytesIO(b"Host: x\r\ncontent-LENGTH:  12 \r\nX-Two: a\r\nx-two: b\r\nFolded: one\r\n  two\r\n\r\nbody")
    )
    assert head.get("Content-Length") == "12" and head["content-length"] == "12"
    assert head.get("X-Two") == "a"
    assert head.get("Folded") == "one two"
    assert head.get("Missing") is None and head.get("Missing", "") == ""
    assert "HOST" in head and "Missing" not in head
    assert head.items()[0] == ("Host", "x")


def test_the_head_ends_at_its_empty_line_and_leaves_the_body_unread() -> None:
    stream = io.BytesIO(b"A: 1\n\nrest")
    assert read_head(stream).get("a") == "1"
    assert stream.read() == b"rest"
    assert read_head(io.BytesIO(b"A: 1\r\n")).get("A") == "1"  # the stream ended: what came


def test_http_clients_limits() -> None:
    with pytest.raises(http.client.LineTooLong):
        read_head(io.BytesIO(b"A: " + b"x" * 70000 + b"\r\n\r\n"))
    with pytest.raises(http.client.HTTPException, match="more than 100 headers"):
        read_head(io.BytesIO(b"".join(b"F%d: v\r\n" % i for i in range(101)) + b"\r\n"))


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    a = Agent(str(tmp_path / "w"), TOKEN)
    t = threading.Thread(target=a.serve_forever, daemon=True)
    t.start()
    yield a
    a.runner.shutdown()
    a.httpd.shutdown()
    t.join(10)


def _exchange(agent: Agent, request: bytes) -> bytes:
    """Everything the agent sends back until it closes the connection (or 5 s pass)."""
    with socket.create_connection(("127.0.0.1", agent.port)) as s:
        s.sendall(request)
        s.settimeout(5.0)
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except TimeoutError:
            pass
        return data


def test_on_the_wire_fields_without_case_and_connection_close(agent: Agent) -> None:
    reply = _exchange(
        agent,
        b"GET /info HTTP/1.1\r\nhost: x\r\nauthorization: bearer " + TOKEN.encode() + b"\r\nCONNECTION: Close\r\n\r\n",
    )
    assert reply.startswith(b"HTTP/1.1 200") and b'"cpus"' in reply  # answered, then closed (recv saw the end)


def test_on_the_wire_bad_heads_and_other_versions_are_refused_as_before(agent: Agent) -> None:
    too_long = _exchange(agent, b"GET /health HTTP/1.1\r\nA: " + b"x" * 70000 + b"\r\n\r\n")
    assert too_long.startswith(b"HTTP/1.1 431") and b"Line too long" in too_long
    too_many = _exchange(agent, b"GET /health HTTP/1.1\r\n" + b"".join(b"F%d: v\r\n" % i for i in range(101)) + b"\r\n")
    assert too_many.startswith(b"HTTP/1.1 431") and b"Too many headers" in too_many
    old = _exchange(agent, b"GET /health HTTP/1.0\r\n\r\n")  # the standard library's: answered and closed
    assert old.startswith(b"HTTP/1.1 200") and old.endswith(b'{"status": "ok"}')
    v2 = _exchange(agent, b"GET /health HTTP/2.0\r\n\r\n")
    assert b"Error code: 505" in v2  # the standard library answers it without a status line
    assert b"Error code: 400" in _exchange(agent, b"GET /health HTTP/1.1 extra\r\n\r\n")
    # a double slash never reads as a scheme-less absolute URI: the path the agent routes is /health
    assert _exchange(agent, b"GET //health HTTP/1.1\r\nConnection: close\r\n\r\n").endswith(b'{"status": "ok"}')
