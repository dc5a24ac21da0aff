"""Talking to the corral server: the token check (``POST /api/projects/<p>/get``) and forwarding one request to
``{server_url}{target}`` with its body and answer streamed, websockets relayed both ways after a 101. Connections to
the server are kept alive and reused (:class:`UpstreamPool`): over the server's SSH connection each new one would
open a channel, a round trip before the request even starts."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

from .core.model import Config
from .httpio import (
    HOP_BY_HOP,
    Framing,
    Head,
    Headers,
    HttpError,
    parse_response,
    read_head,
    relay_body,
    render,
    response_framing,
)

log = logging.getLogger("corral.gateway")
CONNECT_TIMEOUT = 10.0
AUTH_TIMEOUT = 10.0
CLIENT_BODY_TIMEOUT = 60.0  # nginx's client_body_timeout default (nginx.org docs, ngx_http_core_module)
GATEWAY_HEADER = "X-Corral-Gateway"
#: The server's answer to a request it counted itself (held at a service's zero replicas): not counted here.
COUNTED_HEADER = "X-Corral-Counted"


class UpstreamError(Exception):
    """The server could not be reached or answered badly (the client gets a 502 or 504)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def _connect(config: Config) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    try:
        return await asyncio.wait_for(asyncio.open_connection(config.host, config.port), CONNECT_TIMEOUT)
    except (OSError, asyncio.TimeoutError) as e:
        raise UpstreamError(502, f"cannot reach the corral server at {config.server_url}: {e or 'timeout'}") from None


async def check_token(config: Config, project: str, authorization: str) -> bool:
    """Whether the server lets ``authorization`` read ``project`` (any 2xx: yes; 401/403/404: no)."""
    reader, writer = await _connect(config)
    try:
        writer.write(
            render(
                f"POST /api/projects/{project}/get HTTP/1.1",
                [
                    ("Host", f"{config.host}:{config.port}"),
                    ("Authorization", authorization),
                    ("Content-Type", "application/json"),
                    ("Content-Length", "2"),
                    ("Connection", "close"),
                ],
            )
            + b"{}"
        )
        await writer.drain()
        raw = await read_head(reader, AUTH_TIMEOUT)
        if raw is None:
            raise UpstreamError(502, "the corral server closed the connection during the token check")
        status = parse_response(raw).status
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, HttpError) as e:
        raise UpstreamError(502, f"the token check at the corral server failed: {e or 'timeout'}") from None
    finally:
        writer.close()
    if 200 <= status < 300:
        return True
    if status in (400, 401, 403, 404):
        return False
    raise UpstreamError(502, f"the token check at the corral server answered {status}")


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class UpstreamPool:
    """Idle keep-alive connections to the server, newest last; one idle longer than ``idle_timeout`` is closed
    rather than reused (uvicorn, the server's HTTP server, closes idle ones after 5 s by default: its settings
    docs, ``--timeout-keep-alive``)."""

    def __init__(self, max_idle: int = 64, idle_timeout: float = 4.0) -> None:
        self.max_idle = max_idle
        self.idle_timeout = idle_timeout
        self._idle: deque[tuple[str, int, Conn, float]] = deque()

    def take(self, config: Config) -> Conn | None:
        now = time.monotonic()
        while self._idle:
            host, port, conn, since = self._idle.pop()
            if (host, port) == (config.host, config.port) and now - since < self.idle_timeout and not conn[0].at_eof():
                return conn
            conn[1].close()
        return None

    def give(self, config: Config, conn: Conn) -> None:
        self._idle.append((config.host, config.port, conn, time.monotonic()))
        while len(self._idle) > self.max_idle:
            self._idle.popleft()[2][1].close()

    def close(self) -> None:
        while self._idle:
            self._idle.pop()[2][1].close()


@dataclass(frozen=True)
class Exchange:
    """One request to forward: its head, the client's address and the route's limits."""

    head: Head
    target: str
    client_ip: str
    body: Framing
    body_limit: int
    read_timeout: float
    websocket: bool


def _upstream_head(config: Config, ex: Exchange) -> bytes:
    headers: Headers = [
        (k, v)
        for k, v in ex.head.headers
        if k.lower() not in HOP_BY_HOP and k.lower() not in ("x-real-ip", GATEWAY_HEADER.lower())
    ]
    headers += [("X-Real-IP", ex.client_ip), (GATEWAY_HEADER, config.secret)]
    if ex.websocket:
        headers += [("Connection", "Upgrade"), ("Upgrade", ex.head.get("upgrade") or "websocket")]
    return render(f"{ex.head.method} {ex.target} HTTP/1.1", headers)


def _client_head(resp: Head, framing: Framing, close: bool) -> bytes:
    dropped = ("connection", "keep-alive", "proxy-connection", COUNTED_HEADER.lower())
    headers = [(k, v) for k, v in resp.headers if k.lower() not in dropped]
    if resp.status == 101:
        headers += [("Connection", "Upgrade")]
        upgrade = resp.get("upgrade")
        if upgrade:
            headers = [(k, v) for k, v in headers if k.lower() != "upgrade"] + [("Upgrade", upgrade)]
    elif close or framing.kind == "close":
        headers.append(("Connection", "close"))
    return render(f"HTTP/1.1 {resp.status} {resp.reason}".rstrip(), headers)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.CancelledError):
        pass
    finally:
        if writer.can_write_eof():
            try:
                writer.write_eof()
            except OSError:
                pass


async def _relay_both_ways(
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    up_r: asyncio.StreamReader,
    up_w: asyncio.StreamWriter,
) -> None:
    """A websocket after its 101: bytes both ways until one side closes, then a short grace for the other."""
    tasks = [asyncio.ensure_future(_pipe(client_r, up_w)), asyncio.ensure_future(_pipe(up_r, client_w))]
    try:
        _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if pending:
            await asyncio.wait(pending, timeout=5)
    finally:
        for task in tasks:
            task.cancel()


async def _send(config: Config, ex: Exchange, conn: Conn, client_r: asyncio.StreamReader) -> Head | None:
    """Send the request on ``conn`` and read the answer's head; None when the server closed the connection
    before answering (a kept-alive connection it had just closed)."""
    up_r, up_w = conn
    up_w.write(_upstream_head(config, ex))
    try:
        await relay_body(client_r, up_w, ex.body, CLIENT_BODY_TIMEOUT, ex.body_limit)
    except OSError as e:
        raise UpstreamError(502, f"the corral server closed the connection while the body was sent: {e}") from None
    while True:
        try:
            raw = await read_head(up_r, ex.read_timeout)
        except asyncio.TimeoutError:
            raise UpstreamError(
                504, f"the service did not answer within read_timeout ({ex.read_timeout:g} s)"
            ) from None
        except (OSError, HttpError):
            raw = None
        if raw is None:
            return None
        resp = parse_response(raw)
        if resp.status == 101 and not ex.websocket:
            raise UpstreamError(502, "the corral server switched protocols on a request that did not ask to")
        if not 100 <= resp.status < 200 or resp.status == 101:
            return resp
        # an interim answer (103 Early Hints, a 100 Continue the server sent anyway): the final one follows


async def _open_and_send(
    config: Config, ex: Exchange, client_r: asyncio.StreamReader, pool: UpstreamPool
) -> tuple[Conn, Head]:
    """A kept-alive connection if there is one (a request without a body is sent again on a new connection if
    the old one turns out closed), else a new one."""
    conn = None if ex.websocket else pool.take(config)
    if conn is not None:
        try:
            resp = await _send(config, ex, conn, client_r)
        except BaseException:
            conn[1].close()
            raise
        if resp is not None:
            return conn, resp
        conn[1].close()
        if ex.body.kind != "none":
            raise UpstreamError(502, "the corral server closed a kept-alive connection while the request was sent")
    conn = await _connect(config)
    try:
        resp = await _send(config, ex, conn, client_r)
    except BaseException:
        conn[1].close()
        raise
    if resp is None:
        conn[1].close()
        raise UpstreamError(502, "the corral server closed the connection without an answer")
    return conn, resp


async def forward(
    config: Config,
    ex: Exchange,
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    client_keepalive: bool,
    pool: UpstreamPool,
    on_answer: Optional[Callable[[Head], None]] = None,
) -> bool:
    """Forward ``ex``; returns whether the client connection can serve another request (``on_answer`` is given
    the server's answer's head). Raises :class:`UpstreamError` or :class:`HttpError` only before anything of
    the answer reached the client."""
    (up_r, up_w), resp = await _open_and_send(config, ex, client_r, pool)
    if on_answer is not None:
        on_answer(resp)
    reusable = False
    try:
        if resp.status == 101 and ex.websocket:
            client_w.write(_client_head(resp, Framing("none"), False))
            await client_w.drain()
            await _relay_both_ways(client_r, client_w, up_r, up_w)
            return False
        framing = response_framing(resp, ex.head.method)
        keep = client_keepalive and framing.kind != "close"
        client_w.write(_client_head(resp, framing, not keep))
        try:
            await relay_body(up_r, client_w, framing, ex.read_timeout)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, HttpError) as e:
            log.warning("the answer to %s %s was cut: %s", ex.head.method, ex.target, e or "read_timeout")
            return False
        reusable = framing.kind != "close" and resp.version == "HTTP/1.1" and "close" not in resp.tokens("connection")
        return keep
    finally:
        if reusable:
            pool.give(config, (up_r, up_w))
        else:
            up_w.close()
