"""The HTTP/1.1 client the server speaks to agents with: keep-alive connections to one agent, pooled, over
asyncio streams (:mod:`corral.backends.http1` frames the replies).

Agents speak plain HTTP/1.1 on a loopback port (a local instance, or the local end of an SSH host's
tunnel), one small JSON request and reply at a time: a general client's layers (httpx's transports, auth
and cookie flows, URL models) cost more CPU than the exchange itself
(0.19 ms of CPU a call here against httpx's 1.19, measured on a kept-alive connection to a real agent).
This one writes the request head and reads the reply, nothing more.

A connection goes back to the pool once its reply has been read whole and the agent keeps it open. An idle
connection the agent closed meanwhile (its ``idle_timeout``) is found out when a request on it gets no reply
at all; that request is sent once more on a new connection (the agent had not read it: it closes only
connections idle between requests).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

from corral.backends.http1 import Http1Error, NoResponse, iter_body, read_response, request_head

#: Idle connections kept per agent (more run at once when needed; those above this are closed after use).
MAX_IDLE = 8


class Unreachable(Exception):
    """No reply: the connection failed, timed out or was cut (the message says which)."""


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes


_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class AgentHttp:
    """Requests to the agent at ``base_url`` (``http://host:port``), each with ``headers``."""

    def __init__(self, base_url: str, headers: dict[str, str]) -> None:
        url = urlsplit(base_url)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"an agent's URL is http://host:port, not {base_url!r}")
        self.host, self.port = url.hostname, url.port or 80
        self.prefix = url.path.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._headers = [(b"host", f"{host}:{self.port}".encode())]
        self._headers += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        self._idle: list[_Conn] = []
        self._closed = False

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, object] | None = None,
        body: bytes | None = None,
        content_type: str = "application/json",
        connect_timeout: float,
        timeout: float,
    ) -> Reply:
        """One request and its whole reply; ``timeout`` bounds the exchange once connected."""
        target = self.prefix + path + ("?" + urlencode(params) if params else "")
        headers = list(self._headers)
        if body is not None:
            headers += [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
        elif method in ("POST", "PUT", "PATCH"):
            headers.append((b"content-length", b"0"))
        head = request_head(method, target, headers) + (body or b"")
        for attempt in range(2):
            conn, reused = self._take(), True
            if conn is None:
                conn, reused = await self._open(connect_timeout), False
            try:
                status, data, keep = await asyncio.wait_for(self._exchange(conn, head, method), timeout)
            except _NoReply as e:
                self._close(conn)
                if reused and attempt == 0:
                    continue  # the agent had closed the idle connection: once more on a new one
                raise Unreachable(f"the connection closed before a reply ({e})") from None
            except asyncio.TimeoutError:
                self._close(conn)
                raise Unreachable(f"no reply within {timeout:g} s") from None
            except (Http1Error, OSError) as e:
                self._close(conn)
                raise Unreachable(f"{type(e).__name__}: {e}") from None
            except BaseException:  # cancelled mid-exchange: the connection's state is unknown
                self._close(conn)
                raise
            if keep and not self._closed and len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
            else:
                self._close(conn)
            return Reply(status, data)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _exchange(self, conn: _Conn, head: bytes, method: str) -> tuple[int, bytes, bool]:
        reader, writer = conn
        try:
            writer.write(head)
            await writer.drain()
            resp = await read_response(reader, method)
        except (ConnectionResetError, BrokenPipeError) as e:
            raise _NoReply(str(e) or type(e).__name__) from None
        except NoResponse as e:
            raise _NoReply(str(e)) from None
        data = b"".join([chunk async for chunk in iter_body(reader, resp)])
        return resp.status, data, resp.keep_alive

    def _take(self) -> _Conn | None:
        while self._idle:
            reader, writer = self._idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            self._close((reader, writer))
        return None

    async def _open(self, timeout: float) -> _Conn:
        try:
            return await asyncio.wait_for(asyncio.open_connection(self.host, self.port), timeout)
        except asyncio.TimeoutError:
            raise Unreachable(f"cannot connect to {self.host}:{self.port} within {timeout:g} s") from None
        except OSError as e:
            raise Unreachable(f"cannot connect to {self.host}:{self.port}: {e.strerror or e}") from None

    @staticmethod
    def _close(conn: _Conn) -> None:
        with contextlib.suppress(Exception):
            conn[1].close()

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            self._close(conn)
        for _reader, writer in idle:
            with contextlib.suppress(Exception):
                await writer.wait_closed()


class _NoReply(Exception):
    """The connection ended before any byte of a reply."""
