"""A client of a gateway under test: HTTP/1.1 over TLS to the gateway's address with the service's host name
as SNI and ``Host`` (the name resolved by the test itself, as a DNS record pointing at the gateway would),
the certificate verified against a given root only -- or against the system store, which must refuse it."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def _parse(raw: bytes) -> Answer:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0] or b"0", 16)
            if size == 0:
                break
            out, rest = out + rest[:size], rest[size + 2 :]
        body = out
    return Answer(status, headers, body)


async def request(
    address: str,
    host: str,
    path: str,
    *,
    cafile: str | None,
    port: int = 443,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    tls: bool = True,
    timeout: float = 15.0,
) -> Answer:
    """One request (``Connection: close``); ``cafile`` None: the system store."""
    ctx = ssl.create_default_context(cafile=cafile) if tls else None
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(address, port, ssl=ctx, server_hostname=host if tls else None), timeout
    )
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: close", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), timeout)
    writer.close()
    return _parse(raw)


async def certified(address: str, host: str, *, cafile: str, port: int = 443, timeout: float = 5.0) -> bool:
    """Whether the gateway completes a TLS handshake for ``host`` with a certificate ``cafile`` verifies; no
    request is sent, so nothing is counted or woken."""
    ctx = ssl.create_default_context(cafile=cafile)
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(address, port, ssl=ctx, server_hostname=host), timeout
        )
    except (OSError, ssl.SSLError, asyncio.TimeoutError):
        return False
    writer.close()
    return True
