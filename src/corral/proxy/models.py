"""``/proxy/models/<project>/``: the project's OpenAI-compatible endpoint (dstack's model proxy, kept for
corral beyond dstack's deprecation). ``GET …/models`` lists the models the project's live services
serve (``model`` in OpenAI format; the newest run of a name wins); ``POST …/chat/completions`` sends the
request to the service whose model the body's ``model`` names -- at its ``model.prefix`` (``/v1``) --
through the same balancing, counting and scale-from-zero as ``/proxy/services/``, its answer streamed
back unchanged (SSE included). ``v1/models`` and ``v1/chat/completions`` are accepted too. A project
member's token is always required (dstack: ``ProxyAuth(auto_enforce=True)``), or, for the web UI's
playground, a member's UI session: its cookie, its CSRF token in ``X-Corral-CSRF`` and an ``Origin`` naming
this server (a page of another origin, or a service's sandboxed page, has neither the token nor the
origin); an unknown model is dstack's 404 ``Model <name> not found in project <project>``.
"""

from __future__ import annotations

import dataclasses
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import urlsplit

import orjson

from corral.proxy.asgi import Receive, Scope, Send, bearer_token, json_response
from corral.proxy.upstream import Upstream
from corral.services import service_routing, ui_sessions

PREFIX = "/proxy/models/"
#: The largest chat request read to find its ``model`` (the proxy's body limit applies beyond).
MAX_BODY = 16 * 2**20


async def handle(upstream: Upstream, scope: Scope, receive: Receive, send: Send) -> None:
    path: str = scope["path"]
    project, _, rest = path[len(PREFIX) :].partition("/")
    rest = rest.strip("/")
    if rest.startswith("v1/"):
        rest = rest[3:]
    method = scope["method"]
    if not project or (rest, method) not in (("models", "GET"), ("chat/completions", "POST")):
        await json_response(send, 404, {"detail": "Not Found"})
        return
    headers: list[tuple[bytes, bytes]] = list(scope["headers"])
    token = bearer_token(headers)
    # a gateway checked the caller; it cannot count the request (the model names the service, in the body): here
    from_gateway = await upstream.gateways.trusted(headers)
    allowed = from_gateway or (
        await upstream.members.get((token, project))
        if token is not None
        else await _by_session(upstream, headers, project)
    )
    if not allowed:
        await json_response(send, 403, {"detail": f"Unauthenticated or unauthorized to access project {project}"})
        return
    served = await upstream.models.get(project)
    if rest == "models":
        data = [{"object": "model", "id": n, "created": int(at), "owned_by": project} for n, _, at in served]
        await json_response(send, 200, {"object": "list", "data": data})
        return
    body = await _read(receive)
    if body is None:
        await json_response(send, 413, {"detail": "Request body too large"})
        return
    try:
        request = orjson.loads(body)
        name = request["model"]
        if not isinstance(name, str):
            raise TypeError
    except (orjson.JSONDecodeError, KeyError, TypeError):
        await json_response(
            send, 422, {"detail": [{"loc": ["body", "model"], "msg": "field required", "type": "missing"}]}
        )
        return
    run = next((r for n, r, _ in served if n == name), None)
    route = await upstream.routes.get((project, run)) if run is not None else None
    if run is None or route is None:
        await json_response(send, 404, {"detail": f"Model {name} not found in project {project}"})
        return
    route = await upstream.admit(send, (project, run), route)
    if route is None:
        return
    target = f"/proxy/services/{project}/{run}{route.model_prefix.rstrip('/')}/chat/completions"
    inner: dict[str, Any] = {**scope, "path": target, "raw_path": target.encode(), "query_string": b""}
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    await upstream.forward(
        inner, replay, send, dataclasses.replace(route, strip_prefix=True), headers, f"/proxy/services/{project}/{run}"
    )


async def _read(receive: Receive) -> bytes | None:
    parts: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return b""
        data = msg.get("body", b"")
        size += len(data)
        if size > MAX_BODY:
            return None
        parts.append(data)
        if not msg.get("more_body"):
            return b"".join(parts)


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str:
    return next((v.decode("latin-1") for k, v in headers if k == name), "")


async def _by_session(upstream: Upstream, headers: list[tuple[bytes, bytes]], project: str) -> bool:
    """The web UI's session of a member of ``project`` (see the module's docstring)."""
    origin, host = urlsplit(_header(headers, b"origin")), _header(headers, b"host")
    if not host or origin.scheme not in ("http", "https") or origin.netloc.lower() != host.lower():
        return False
    cookies: SimpleCookie = SimpleCookie()
    try:
        cookies.load(_header(headers, b"cookie"))
    except CookieError:
        return False
    session = cookies.get(ui_sessions.COOKIE)
    if session is None:
        return False
    return await service_routing.session_member(
        upstream.ctx, session.value, _header(headers, b"x-corral-csrf"), project
    )
