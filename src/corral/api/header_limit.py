"""The size limit on request headers: one ASGI middleware, outside every other but the access log, so that
the API, the services proxy and the web UI all refuse an oversized header the same way.

A header whose name and value together are longer than ``Settings.max_header_bytes`` (8 KiB by default,
nginx's default for one header line: ``large_client_header_buffers 4 8k``,
https://nginx.org/en/docs/http/ngx_http_core_module.html#large_client_header_buffers) is answered
431 Request Header Fields Too Large (RFC 6585 §5), naming the header, in dstack's error shape, and the
connection is closed (the body is never read). uvicorn's HTTP parser bounds the whole head already
(h11's 16 KiB), so one header is the limit left to set. A WebSocket handshake with such a header is
refused before it is accepted.

Imports: Starlette's types and responses only.
"""

from __future__ import annotations

import logging

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger("corral.api")

#: how much of an oversized header's name the answer and the log repeat
_NAME_SHOWN = 64


def oversized_header(headers: list[tuple[bytes, bytes]], limit: int) -> tuple[str, int] | None:
    """The first header longer than ``limit`` bytes (name and value): (its name as sent, its length)."""
    for name, value in headers:
        size = len(name) + len(value)
        if size > limit:
            shown = name.decode("latin-1")
            return (shown if len(shown) <= _NAME_SHOWN else shown[:_NAME_SHOWN] + "..."), size
    return None


class HeaderLimit:
    """ASGI middleware: 431 for a request with a header longer than ``limit`` bytes."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = oversized_header(scope["headers"], self.limit) if scope["type"] in ("http", "websocket") else None
        if found is None:
            await self.app(scope, receive, send)
            return
        name, size = found
        msg = (
            f"The request header {name!r} is {size} bytes long; the limit is {self.limit} bytes per header"
            " (the server's CORRAL_MAX_HEADER_BYTES)"
        )
        log.info("refused %s %s: 431 %s", scope.get("method", "WEBSOCKET"), scope["path"], msg)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": "request header too large"})
            return
        answer = JSONResponse(
            {"detail": [{"msg": msg, "code": "header_too_large"}]}, status_code=431, headers={"connection": "close"}
        )
        await answer(scope, receive, send)
