"""WebSocket upgrades through the proxy: the caller's WebSocket (an ASGI ``websocket`` scope) bridged to a
WebSocket opened to the replica (wsproto, over the same channel to the host as HTTP requests). Messages
pass both ways as they come; a close on either side closes the other with the same code. dstack's
in-server proxy refuses upgrades (#2231).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
#: Request headers the handshake itself writes (the rest are passed on).
_HANDSHAKE = frozenset(
    {
        b"host",
        b"upgrade",
        b"connection",
        b"sec-websocket-key",
        b"sec-websocket-version",
        b"sec-websocket-extensions",
        b"sec-websocket-protocol",
        b"content-length",
        b"transfer-encoding",
    }
)


class UpstreamRefused(Exception):
    """The replica did not accept the WebSocket (its status, or why the connection failed)."""


async def bridge(  # noqa: C901, PLR0915
    conn: tuple[Any, Any],
    target: str,
    host: str,
    headers: list[tuple[bytes, bytes]],
    subprotocols: list[str],
    receive: Receive,
    send: Send,
) -> None:
    """Open the WebSocket to the replica on ``conn``, accept the caller's, then relay until either closes.
    Raises ``UpstreamRefused`` before accepting the caller's when the replica refuses."""
    reader, writer = conn
    ws = WSConnection(ConnectionType.CLIENT)
    extra = [(k, v) for k, v in headers if k not in _HANDSHAKE]
    writer.write(ws.send(Request(host=host, target=target, extra_headers=extra, subprotocols=subprotocols)))
    await writer.drain()
    accepted: AcceptConnection | None = None
    while accepted is None:
        data = await reader.read(65536)
        if not data:
            raise UpstreamRefused("the replica closed the connection during the handshake")
        ws.receive_data(data)
        for event in ws.events():
            if isinstance(event, AcceptConnection):
                accepted = event
            elif isinstance(event, (RejectConnection, RejectData)):
                raise UpstreamRefused(f"the replica refused the WebSocket (HTTP {getattr(event, 'status_code', '?')})")
    await send({"type": "websocket.accept", "subprotocol": accepted.subprotocol})
    closed = asyncio.Event()

    async def down_to_up() -> None:
        while not closed.is_set():
            msg = await receive()
            if msg["type"] == "websocket.receive":
                if msg.get("text") is not None:
                    writer.write(ws.send(Message(data=msg["text"])))
                else:
                    writer.write(ws.send(Message(data=msg.get("bytes") or b"")))
                await writer.drain()
            elif msg["type"] == "websocket.disconnect":
                with contextlib.suppress(Exception):
                    writer.write(ws.send(CloseConnection(code=int(msg.get("code") or 1000))))
                    await writer.drain()
                closed.set()

    async def up_to_down() -> None:
        text: list[str] = []
        binary: list[bytes] = []
        while not closed.is_set():
            data = await reader.read(65536)
            if not data:
                await send({"type": "websocket.close", "code": 1011})
                closed.set()
                return
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, TextMessage):
                    text.append(event.data)
                    if event.message_finished:
                        await send({"type": "websocket.send", "text": "".join(text)})
                        text.clear()
                elif isinstance(event, BytesMessage):
                    binary.append(bytes(event.data))
                    if event.message_finished:
                        await send({"type": "websocket.send", "bytes": b"".join(binary)})
                        binary.clear()
                elif isinstance(event, Ping):
                    writer.write(ws.send(event.response()))
                    await writer.drain()
                elif isinstance(event, CloseConnection):
                    with contextlib.suppress(Exception):
                        writer.write(ws.send(event.response()))
                        await writer.drain()
                    await send({"type": "websocket.close", "code": event.code})
                    closed.set()
                    return

    tasks = [asyncio.ensure_future(down_to_up()), asyncio.ensure_future(up_to_down())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            writer.close()
