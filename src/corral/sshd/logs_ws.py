"""A job's ``/logs_ws`` websocket, as dstack's runner serves it at ``localhost:10999`` (the attached CLI
forwards a local port there and reads the job's output from it).

The history is replayed from the database (entries after ``start_time``, an RFC 3339 time, when given),
each entry one binary message; new output follows as the jobs worker stores it; the socket is closed
(code 1000) only once the job has ended and everything was sent. Only the handshake and server frames
of RFC 6455 are needed: the client sends nothing but its close, which ends the stream.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import struct
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

from corral.context import Context
from corral.services import ssh_access

_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
POLL_S = 0.2
RUNNER_HTTP_PORT = 10999


def ws_frame(opcode: int, payload: bytes) -> bytes:
    n = len(payload)
    if n < 126:
        head = struct.pack(">BB", 0x80 | opcode, n)
    elif n < 1 << 16:
        head = struct.pack(">BBH", 0x80 | opcode, 126, n)
    else:
        head = struct.pack(">BBQ", 0x80 | opcode, 127, n)
    return head + payload


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1((key + _GUID).encode()).digest()).decode()


def _start_time(query: dict[str, list[str]]) -> float | None:
    values = query.get("start_time") or [""]
    raw = values[-1]
    if not raw:
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


async def serve(ctx: Context, job_id: str, reader: Any, writer: Any) -> None:
    """Answer one HTTP connection to the job's runner port: the websocket, or 404 for anything else."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    except (asyncio.IncompleteReadError, asyncio.TimeoutError, asyncio.LimitOverrunError, OSError):
        writer.close()
        return
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split()
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
    url = urlsplit(parts[1] if len(parts) > 1 else "/")
    key = headers.get("sec-websocket-key")
    if url.path != "/logs_ws" or not key:
        body = b"not found: only /logs_ws (a websocket) is served here\n"
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        writer.write_eof()
        writer.close()
        return
    writer.write(
        (
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {accept_key(key)}\r\n\r\n"
        ).encode()
    )
    closed = asyncio.ensure_future(reader.read(1))  # the client's close (or its end) stops the stream
    try:
        await _stream(ctx, job_id, _start_time(parse_qs(url.query)), writer, closed)
    finally:
        closed.cancel()
        writer.close()


async def _stream(ctx: Context, job_id: str, start_time: float | None, writer: Any, closed: Any) -> None:
    after: int | None = None
    while not closed.done():
        job = await ssh_access.job_status(ctx, job_id)
        ended = job is None or job.status not in ssh_access.ACTIVE
        entries = await ssh_access.read_logs(ctx, job_id, after, start_time)
        for e in entries:
            writer.write(ws_frame(0x2, e.message))
            after = e.id
        if entries:
            await writer.drain()
            continue
        if ended:
            writer.write(ws_frame(0x8, struct.pack(">H", 1000)))
            await writer.drain()
            return
        await asyncio.wait({closed}, timeout=POLL_S)
