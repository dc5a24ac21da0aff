"""Sessions into a running job through its agent (the agent's side: :mod:`corral.agent.sessions`).

:func:`open_stream` makes one HTTP connection to the agent's URL (on loopback, or the local end of an SSH
fleet host's tunnel), asks for ``POST /jobs/{id}/exec`` or ``/connect`` with ``Upgrade: corral-session``
and, on ``101``, hands back the connection's asyncio streams, which then carry the session (frames of
:mod:`corral.agent.protocol_session`, or a connection's raw bytes). Any other answer is an
:class:`~corral.backends.agent_client.AgentError` with the agent's words.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

from corral.agent.protocol_session import HEADER, MAX_FRAME, UPGRADE, frame
from corral.backends.agent_client import AgentError, AgentUnreachable

__all__ = ["HEADER", "frame", "open_stream", "read_frame"]


async def open_stream(
    base_url: str, token: str, job_id: str, kind: str, body: dict[str, Any], timeout: float = 10.0
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    url = urlsplit(base_url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, asyncio.TimeoutError) as e:
        raise AgentUnreachable(f"agent at {base_url}: {type(e).__name__}: {e}") from e
    data = json.dumps(body).encode()
    writer.write(
        (
            f"POST /jobs/{job_id}/{kind} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
            f"Upgrade: {UPGRADE}\r\nConnection: Upgrade\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        ).encode()
        + data
    )
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        if status == 101:
            return reader, writer
        length = next((int(v) for k, _, v in (h.partition(":") for h in lines[1:]) if k.lower() == "content-length"), 0)
        raw = await asyncio.wait_for(reader.readexactly(length), timeout) if length else b""
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError, IndexError) as e:
        writer.close()
        raise AgentUnreachable(f"agent at {base_url}: {kind}: {type(e).__name__}: {e}") from e
    writer.close()
    try:
        detail = json.loads(raw).get("error")
    except (ValueError, AttributeError):
        detail = raw[:200].decode(errors="replace")
    raise AgentError(str(detail or f"HTTP {status}"), status)


async def read_frame(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """The next frame (kind, payload), or None at the end of the stream."""
    try:
        head = await reader.readexactly(HEADER.size)
        kind, size = HEADER.unpack(head)
        if size > MAX_FRAME:
            return None
        return kind, (await reader.readexactly(size) if size else b"")
    except (asyncio.IncompleteReadError, OSError):
        return None
