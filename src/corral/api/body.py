"""Reading a request's JSON body within bounds: its size, then its shape.

Owns the input edge of every JSON route (handlers call it through ``parse``, after they have
authenticated the caller, so that an anonymous body is never read):

* **size**: the route's limit (``limit=`` on its ``RouteTable`` decorator, ``Settings.request_body_limit``
  unless told) is checked against ``Content-Length`` before a byte is read, and again while a body
  without one streams in; past it the answer is a 413 in dstack's error shape and the rest is never read;
* **shape**: once parsed, the document is walked (iteratively, so that no depth overflows a stack) and
  refused with a 422 naming the field when it nests deeper than ``max_json_depth``, has an array or
  object longer than ``max_list_length``, a string longer than ``max_string_length``, or an integer
  outside 64 bits (SQL columns and dstack's models are 64-bit).

May import starlette, orjson and ``corral.api.routing``.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request

from corral.api.routing import BODY_LIMIT_KEY, BODY_LIMITS, RequestValidationError

_INT64 = 2**63


class PayloadTooLarge(Exception):
    """413 ``{"detail": [{"msg", "code"}]}``: the body is over the route's limit (not read past it)."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self.msg = msg


def _settings(request: Request) -> Any:
    return request.app.state.ctx.settings


def body_limit(request: Request) -> tuple[int, str]:
    """The route's body-size limit in bytes (0: none) and the setting that holds it."""
    attr = BODY_LIMITS[request.scope.get(BODY_LIMIT_KEY, "request")]
    return int(getattr(_settings(request), attr)), attr


def _too_large(limit: int, attr: str) -> PayloadTooLarge:
    var = "CORRAL_SERVER_" + attr.upper()
    return PayloadTooLarge(f"The request body is larger than this route's limit of {limit} bytes (the server's {var})")


async def read_bounded(request: Request) -> bytes:
    """The raw body, or :class:`PayloadTooLarge` as soon as it is known to be over the route's limit."""
    limit, attr = body_limit(request)
    if not limit:
        return await request.body()
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            size = -1
        if size < 0:
            raise RequestValidationError(
                [{"type": "value_error", "loc": ["header", "content-length"], "msg": "Invalid Content-Length"}]
            )
        if size > limit:
            raise _too_large(limit, attr)
    chunks: list[bytes] = []
    got = 0
    async for chunk in request.stream():
        got += len(chunk)
        if got > limit:
            raise _too_large(limit, attr)
        chunks.append(chunk)
    return b"".join(chunks)


def _refusal(kind: str, loc: list[Any], msg: str) -> RequestValidationError:
    return RequestValidationError([{"type": kind, "loc": ["body", *loc], "msg": msg, "input": None}])


def check_shape(doc: Any, settings: Any) -> None:  # noqa: C901
    """Refuse (422, the field named) a document deeper, longer or larger than the settings allow."""
    max_depth, max_items, max_chars = settings.max_json_depth, settings.max_list_length, settings.max_string_length
    stack: list[tuple[Any, tuple[Any, ...]]] = [(doc, ())]
    while stack:
        value, loc = stack.pop()
        if isinstance(value, str):
            if len(value) > max_chars:
                raise _refusal(
                    "string_too_long",
                    list(loc),
                    f"String should have at most {max_chars} characters (the server's CORRAL_MAX_STRING_LENGTH)",
                )
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int):
            if not -_INT64 <= value < _INT64:
                raise _refusal("int_too_big", list(loc), "Integer should fit in 64 bits (signed)")
        elif isinstance(value, float):
            if abs(value) >= float(_INT64) and value.is_integer():
                raise _refusal("int_too_big", list(loc), "Integer should fit in 64 bits (signed)")
        elif isinstance(value, (list, dict)):
            if len(loc) >= max_depth:
                raise _refusal(
                    "too_deep",
                    list(loc[:8]) + (["..."] if len(loc) > 8 else []),
                    f"The body nests deeper than {max_depth} levels (the server's CORRAL_MAX_JSON_DEPTH)",
                )
            if len(value) > max_items:
                what = "List" if isinstance(value, list) else "Object"
                raise _refusal(
                    "too_long",
                    list(loc),
                    f"{what} should have at most {max_items} items (the server's CORRAL_MAX_LIST_LENGTH)",
                )
            if isinstance(value, dict):
                for key, item in value.items():
                    if len(key) > max_chars:
                        raise _refusal("string_too_long", [*loc, key[:64]], "Object key is too long")
                    stack.append((item, (*loc, key)))
            else:
                stack.extend((item, (*loc, i)) for i, item in enumerate(value))


async def read_json(request: Request) -> Any:
    """The body as JSON, bounded in size and shape (an empty body is ``{}``)."""
    raw = await read_bounded(request)
    if not raw.strip():
        return {}
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise RequestValidationError(
            [{"type": "json_invalid", "loc": ["body", 0], "msg": f"JSON decode error: {e}", "input": {}}]
        ) from None
    check_shape(doc, _settings(request))
    return doc
