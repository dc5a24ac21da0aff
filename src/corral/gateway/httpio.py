"""HTTP/1.1 over asyncio streams, as much as a reverse proxy needs: request and response heads, body framing
(length, chunked, until close) and relaying a body piece by piece as it arrives (nothing buffered whole)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Optional

HEAD_LIMIT = 64 * 1024
PIECE = 64 * 1024
HOP_BY_HOP = frozenset(
    ("connection", "keep-alive", "proxy-connection", "proxy-authenticate", "te", "trailer", "upgrade", "expect")
)
_REASONS = {
    100: "Continue",
    101: "Switching Protocols",
    200: "OK",
    301: "Moved Permanently",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Content Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}

Headers = list[tuple[str, str]]


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Head:
    """A request head (``method``, ``target``) or a response head (``status``, ``reason``)."""

    version: str
    headers: Headers
    method: str = ""
    target: str = ""
    status: int = 0
    reason: str = ""

    def get(self, name: str) -> Optional[str]:
        values = [v for k, v in self.headers if k.lower() == name]
        return ", ".join(values) if values else None

    def tokens(self, name: str) -> list[str]:
        return [t.strip().lower() for t in (self.get(name) or "").split(",") if t.strip()]


@dataclass(frozen=True)
class Framing:
    kind: str  # "none", "length", "chunked", "close"
    length: int = 0


async def read_head(reader: asyncio.StreamReader, timeout: float) -> Optional[bytes]:
    """The next head (through its blank line), or None when the peer closed before sending anything."""
    try:
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    except asyncio.IncompleteReadError as e:
        if not e.partial.strip():
            return None
        raise HttpError(400, "The request ended inside its head") from None
    except asyncio.LimitOverrunError:
        raise HttpError(431, "The request head is larger than 64 KiB") from None
    return raw


def _fields(lines: list[bytes]) -> Headers:
    headers: Headers = []
    for line in lines:
        if b"\r" in line or b"\n" in line or b"\0" in line:  # a lone CR or LF could split a line downstream
            raise HttpError(400, "A header line holds a bare CR, LF or NUL")
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep or not name or name != name.strip() or any(c in name for c in " \t"):
            raise HttpError(400, "A header line is malformed")
        headers.append((name, value.strip()))
    return headers


def parse_request(raw: bytes) -> Head:
    lines = raw[:-4].split(b"\r\n")
    parts = lines[0].decode("latin-1").split(" ")
    if any(c in lines[0] for c in (b"\r", b"\n", b"\0", b"\t")):
        raise HttpError(400, "The request line holds a control character")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0") or not parts[0].isalpha():
        raise HttpError(400, "The request line is not HTTP/1.1")
    return Head(version=parts[2], headers=_fields(lines[1:]), method=parts[0].upper(), target=parts[1])


def parse_response(raw: bytes) -> Head:
    lines = raw[:-4].split(b"\r\n")
    parts = lines[0].decode("latin-1").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise HttpError(502, "The upstream answered with something that is not HTTP/1.x")
    return Head(version=parts[0], headers=_fields(lines[1:]), status=int(parts[1]), reason=(parts[2:] or [""])[0])


def request_framing(head: Head) -> Framing:
    te = head.tokens("transfer-encoding")
    cl = head.get("content-length")
    if te:
        if te[-1] != "chunked" or cl is not None:
            raise HttpError(400, "Transfer-Encoding must end with chunked, without Content-Length")
        return Framing("chunked")
    if cl is None:
        return Framing("none")
    if not cl.isdigit():
        raise HttpError(400, "Content-Length is not a number")
    return Framing("length", int(cl)) if int(cl) else Framing("none")


def response_framing(head: Head, method: str) -> Framing:
    if method == "HEAD" or head.status < 200 or head.status in (204, 304):
        return Framing("none")
    if head.tokens("transfer-encoding"):
        return Framing("chunked")
    cl = head.get("content-length")
    if cl is not None and cl.isdigit():
        return Framing("length", int(cl))
    return Framing("close")


def render(first_line: str, headers: Headers) -> bytes:
    lines = [first_line] + [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def simple_response(
    status: int,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
    extra: Headers | None = None,
    close: bool = False,
) -> bytes:
    headers: Headers = [("Content-Type", content_type), ("Content-Length", str(len(body))), *(extra or [])]
    if close:
        headers.append(("Connection", "close"))
    return render(f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}", headers) + body


async def _read(reader: asyncio.StreamReader, n: int, timeout: float) -> bytes:
    data = await asyncio.wait_for(reader.read(n), timeout)
    if not data:
        raise ConnectionError("the peer closed in the middle of a body")
    return data


async def relay_body(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    framing: Framing,
    timeout: float,
    limit: int = 0,
) -> int:
    """Copy one body from ``reader`` to ``writer`` as it arrives, keeping its framing (chunks stay chunks, so a
    server-sent event reaches the client when it is sent); returns its size. Past ``limit`` (if not 0): 413."""
    if framing.kind == "length":
        left = framing.length
        while left:
            data = await _read(reader, min(left, PIECE), timeout)
            left -= len(data)
            writer.write(data)
            await writer.drain()
        return framing.length
    if framing.kind == "close":
        size = 0
        while True:
            data = await asyncio.wait_for(reader.read(PIECE), timeout)
            if not data:
                return size
            size += len(data)
            writer.write(data)
            await writer.drain()
    if framing.kind == "chunked":
        return await _relay_chunked(reader, writer, timeout, limit)
    return 0


async def _relay_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float, limit: int) -> int:
    size = 0
    while True:
        line = await asyncio.wait_for(reader.readuntil(b"\r\n"), timeout)
        try:
            n = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise HttpError(400, "A chunk size is not hexadecimal") from None
        size += n
        if limit and size > limit:
            raise HttpError(413, "The request body is larger than the service's client_max_body_size")
        writer.write(line)
        if n == 0:
            while True:  # trailers, then the blank line
                trailer = await asyncio.wait_for(reader.readuntil(b"\r\n"), timeout)
                writer.write(trailer)
                if trailer == b"\r\n":
                    await writer.drain()
                    return size
        left = n + 2
        while left:
            data = await _read(reader, min(left, PIECE), timeout)
            left -= len(data)
            writer.write(data)
        await writer.drain()
