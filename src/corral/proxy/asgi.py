"""What every ASGI route of the proxy shares: the ASGI types, a JSON answer, and the bearer token of a request."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def json_response(send: Send, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """Answer ``body`` as JSON with ``status`` (and ``headers`` besides the content's own)."""
    data = orjson.dumps(body)
    hs = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": hs})
    await send({"type": "http.response.body", "body": data})


def bearer_token(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The token of the request's ``Authorization: Bearer <token>`` header, if it has one."""
    for k, v in headers:
        if k == b"authorization":
            scheme, _, token = v.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None
