"""A small HTTP/1.1 client over a byte stream that is already open (a TCP connection to a replica's port,
or a channel of a host's SSH connection): write a request head, read a response head, stream a body by
its framing (``Content-Length``, chunked, or until the connection closes). The proxy and the probes of
service replicas share it; it never buffers a whole body.

Standard library only (asyncio streams, or anything with their ``readuntil``/``readexactly``/``read``/
``write``/``drain``/``close``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

#: The largest response head read (status line and headers).
MAX_HEAD = 64 * 1024
_CHUNK = 64 * 1024
Headers = list[tuple[bytes, bytes]]


class Http1Error(Exception):
    """The upstream's reply is not HTTP/1.x we can read (or the connection ended in the middle of it)."""


class NoResponse(Http1Error):
    """The connection ended before any byte of a response (a kept-alive one the upstream had closed)."""


class Stream(Protocol):
    async def readuntil(self, separator: bytes = ...) -> bytes: ...

    async def readexactly(self, n: int) -> bytes: ...

    async def read(self, n: int = ...) -> bytes: ...


@dataclass
class Response:
    status: int
    reason: bytes
    headers: Headers
    #: How the body ends: ``length`` (``length`` bytes), ``chunked``, ``close`` (at EOF) or ``none``.
    framing: str
    length: int = 0

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None

    @property
    def keep_alive(self) -> bool:
        """Whether the connection may carry another request once the body is read."""
        conn = (self.header(b"connection") or b"").lower()
        return self.framing != "close" and b"close" not in conn


def request_head(method: str, target: str, headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    lines = [f"{method} {target} HTTP/1.1".encode("latin-1")]
    lines.extend(k + b": " + v for k, v in headers)
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def read_response(reader: Stream, method: str) -> Response:  # noqa: C901
    """The response head (skipping ``100 Continue``s) and how its body is framed."""
    while True:
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as e:
            if not e.partial:
                raise NoResponse("the connection closed before a response") from None
            raise Http1Error("a cut response head") from None
        except asyncio.LimitOverrunError:
            raise Http1Error(f"the response head is longer than {MAX_HEAD} bytes") from None
        lines = raw[:-4].split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise Http1Error(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        status = int(parts[1])
        headers: Headers = []
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise Http1Error(f"a malformed header line: {line[:80]!r}")
            headers.append((name.strip().lower(), value.strip()))
        if status == 100:
            continue
        resp = Response(status, parts[2] if len(parts) > 2 else b"", headers, "none")
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return resp
        te = resp.header(b"transfer-encoding")
        if te is not None and b"chunked" in te.lower():
            resp.framing = "chunked"
        elif (cl := resp.header(b"content-length")) is not None:
            try:
                resp.framing, resp.length = "length", int(cl)
            except ValueError:
                raise Http1Error(f"a bad Content-Length: {cl[:40]!r}") from None
            if resp.length == 0:
                resp.framing = "none"
        else:
            resp.framing = "close"
        return resp


async def iter_body(reader: Stream, resp: Response) -> AsyncIterator[bytes]:
    """The body's bytes as they arrive (chunked bodies de-chunked); raises ``Http1Error`` on a cut body."""
    try:
        if resp.framing == "length":
            left = resp.length
            while left > 0:
                data = await reader.read(min(left, _CHUNK))
                if not data:
                    raise Http1Error(f"the body ended {left} bytes short")
                left -= len(data)
                yield data
        elif resp.framing == "chunked":
            while True:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.split(b";", 1)[0].strip() or b"x", 16)
                if size == 0:
                    while (await reader.readuntil(b"\r\n")) != b"\r\n":
                        pass  # trailers: dropped
                    return
                data = await reader.readexactly(size)
                await reader.readexactly(2)
                yield data
        elif resp.framing == "close":
            while data := await reader.read(_CHUNK):
                yield data
    except asyncio.IncompleteReadError:
        raise Http1Error("the body was cut short") from None
    except ValueError:
        raise Http1Error("a malformed chunk size") from None


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


async def simple_request(
    reader: Any, writer: Any, method: str, target: str, headers: Headers, body: bytes | None, timeout: float
) -> tuple[int, bytes]:
    """One whole request and its status and (first 64 KiB of) body; for probes. The connection is closed."""

    async def go() -> tuple[int, bytes]:
        hs = [*headers, (b"connection", b"close")]
        if body is not None:
            hs.append((b"content-length", str(len(body)).encode()))
        writer.write(request_head(method.upper(), target, hs) + (body or b""))
        await writer.drain()
        resp = await read_response(reader, method.upper())
        out = b""
        async for data in iter_body(reader, resp):
            if len(out) < _CHUNK:
                out += data[: _CHUNK - len(out)]
        return resp.status, out

    try:
        return await asyncio.wait_for(go(), timeout)
    finally:
        try:
            writer.close()
        except Exception:
            pass
