"""Shared router plumbing: JSON responses, the caller's identity and role, the client-version check,
and the mapping of service errors to dstack's error bodies."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral import DSTACK_API_VERSION, diskspace
from corral.api.body import PayloadTooLarge, read_json
from corral.api.routing import RequestValidationError
from corral.context import Context
from corral.domain.documents import json_default
from corral.domain.records import ProjectRec, UserRec
from corral.services import accounts
from corral.services.errors import (
    AccessDenied,
    Forbidden,
    InvalidConfiguration,
    ProjectNotFound,
    ServiceError,
    StorageFull,
)

log = logging.getLogger("corral.api")
access = logging.getLogger("corral.access")


class FastJSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, default=json_default)


class NotAuthenticated(Exception):
    pass


def ctx_of(request: Request) -> Context:
    ctx: Context = request.app.state.ctx
    return ctx


class AccessCache:
    """Who a token is and which projects they may use, remembered for ``ttl`` seconds.

    Saves two to three queries on every request, and the read transaction of the projects a global list covers
    (``dstack ps`` polls ``/api/runs/list``). A change to users, tokens, projects or members clears
    the cache of every replica at once (:func:`forget_access`: in process, and on Postgres through the
    replicas' ``NOTIFY`` channel); should a notification be lost, a revoked token or role stays valid for
    at most ``ttl`` (1 s) all the same.
    """

    def __init__(self, ttl: float = 1.0) -> None:
        self.ttl = ttl
        self._users: dict[str, tuple[float, UserRec]] = {}
        self._projects: dict[tuple[str, str, str], tuple[float, ProjectRec]] = {}
        self._project_ids: dict[tuple[str, tuple[str, ...] | None], tuple[float, list[str] | None]] = {}

    def clear(self) -> None:
        """Forget everything: called by this replica after it changes users, projects or members."""
        self._users.clear()
        self._projects.clear()
        self._project_ids.clear()

    async def user(self, request: Request, token: str) -> UserRec:
        now = time.monotonic()
        hit = self._users.get(token)
        if hit is not None and hit[0] > now:
            return hit[1]
        user = await accounts.authenticate(ctx_of(request).db, token)
        if len(self._users) > 10_000:
            self._users.clear()
        self._users[token] = (now + self.ttl, user)
        return user

    async def project(self, request: Request, user: UserRec, name: str, need: str) -> ProjectRec:
        now = time.monotonic()
        key = (user.id, name, need)
        hit = self._projects.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        project = await accounts.project_access(ctx_of(request).db, user, name, need)
        if len(self._projects) > 10_000:
            self._projects.clear()
        self._projects[key] = (now + self.ttl, project)
        return project

    async def project_ids(self, request: Request, user: UserRec, names: list[str] | None) -> list[str] | None:
        """``accounts.member_project_ids``: the projects a global list covers for ``user`` (None: every one)."""
        now = time.monotonic()
        key = (user.id, None if names is None else tuple(names))
        hit = self._project_ids.get(key)
        if hit is not None and hit[0] > now:
            return None if hit[1] is None else list(hit[1])
        ids = await accounts.member_project_ids(ctx_of(request).db, user, names)
        if len(self._project_ids) > 10_000:
            self._project_ids.clear()
        self._project_ids[key] = (now + self.ttl, None if ids is None else list(ids))
        return ids


def forget_access(request: Request) -> None:
    """Users, tokens, projects or members changed: every replica forgets what it cached (the cache listens
    to the ``access`` wake-up, see ``create_app``)."""
    _cache(request).clear()
    ctx_of(request).wakeups.wake("access")


def _cache(request: Request) -> AccessCache:
    cache: AccessCache = request.app.state.access_cache
    return cache


async def current_user(request: Request) -> UserRec:
    header = request.headers.get("authorization")
    if not header:
        raise NotAuthenticated
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise NotAuthenticated
    return await _cache(request).user(request, token.strip())


async def member_project_ids(request: Request, user: UserRec, names: list[str] | None) -> list[str] | None:
    """The projects a global list (runs, fleets, instances, volumes) covers for the caller ``user``: member projects
    only (every project for a global admin: None), narrowed to ``names`` (``accounts.member_project_ids``), as
    :class:`AccessCache` remembers them."""
    return await _cache(request).project_ids(request, user, names)


async def member(request: Request, project_name: str, need: str = "member") -> tuple[UserRec, ProjectRec]:
    """The caller and the project, if the caller passes the route rule ``need`` (dstack's permission
    dependency for the route, :mod:`corral.domain.access`): ``member`` (ProjectMember, the default),
    ``member_or_public``, ``manager``, ``manager_or_public`` or ``admin``."""
    user = await current_user(request)
    project = await _cache(request).project(request, user, project_name, need)
    return user, project


async def body_json(request: Request) -> Any:
    """The body as JSON within the route's size limit and the shape caps (:mod:`corral.api.body`)."""
    return await read_json(request)


#: major.minor.patch at the start of the header (``0.19.0rc1`` is 0.19.0), each part at most 9 digits
_VERSION = re.compile(r"^(\d{1,9})\.(\d{1,9})\.(\d{1,9})(?!\d)")


def check_client_version(value: str | None) -> JSONResponse | None:
    if value is None or value in ("", "0.0.0", "latest"):
        return None
    shown = value if len(value) <= 40 else value[:40] + "..."
    m = _VERSION.match(value)
    if m is None:
        return JSONResponse({"detail": [{"msg": f"Invalid version: {shown}", "code": None}]}, status_code=400)
    client = tuple(int(x) for x in m.groups())
    server = tuple(int(x) for x in DSTACK_API_VERSION.split("."))
    if client > server and client[:2] != server[:2]:
        msg = f"The client/CLI version ({shown}) is incompatible with the server version ({DSTACK_API_VERSION})."
        return JSONResponse({"detail": [{"msg": msg, "code": "error"}]}, status_code=400)
    return None


def _jsonable_errors(errors: Any) -> list[dict[str, Any]]:
    out = []
    for e in errors:
        item = {k: v for k, v in dict(e).items() if k in ("type", "loc", "msg", "input")}
        try:
            json.dumps(item.get("input"))
        except (TypeError, ValueError):
            item["input"] = str(item.get("input"))
        except RecursionError:  # nested deeper than the encoder goes: not shown
            item["input"] = None
        out.append(item)
    return out


def log_rejected(method: str, path: str, status: int, msg: str) -> None:
    """One INFO line for a request the API refused (4xx), with the message the caller got."""
    log.info(
        "%s %s refused: %d %s",
        method,
        path,
        status,
        msg,
        extra={"event": "request_rejected", "method": method, "path": path, "status": status},
    )


#: The most of an unread body the server reads (and drops) after answering, so that the client sees the
#: answer rather than a reset connection; beyond it (or after ``_DRAIN_SECONDS``) the connection is closed.
_DRAIN_BYTES = 2 * 2**20
_DRAIN_SECONDS = 2.0


def _declared_length(scope: Scope) -> int | None:
    """The request's Content-Length (None: chunked or invalid; 0: no body)."""
    for key, value in scope["headers"]:
        if key == b"content-length":
            return int(value) if value.strip().isdigit() else None
        if key == b"transfer-encoding":
            return None
    return 0


async def _drain(receive: Receive, declared: int | None, received: int) -> bool:
    """Read and drop the rest of a body if it is small; whether it was all read."""
    if declared is not None and declared - received > _DRAIN_BYTES:
        return False
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _DRAIN_SECONDS
    dropped = 0
    while dropped <= _DRAIN_BYTES:
        try:
            message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.001))
        except TimeoutError:
            return False
        if message["type"] != "http.request":
            return False
        dropped += len(message.get("body", b""))
        if not message.get("more_body", False):
            return True
    return False


class AccessLog:
    """ASGI middleware, outermost when the server runs with ``--access-log``: one line per HTTP request --
    API calls and proxied service requests alike -- (``corral.access``: client, method, path, status,
    duration)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started_at = time.perf_counter()
        status = 0

        async def send_noted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_noted)
        finally:
            client = scope.get("client")
            query = scope.get("query_string") or b""
            target = scope["path"] + ("?" + query.decode("latin-1") if query else "")
            ms = (time.perf_counter() - started_at) * 1000
            access.info(
                '%s "%s %s" %d %.1fms',
                f"{client[0]}:{client[1]}" if client else "-",
                scope["method"],
                target,
                status,
                ms,
                extra={"event": "request", "method": scope["method"], "path": scope["path"], "status": status},
            )


def _version_refusal(scope: Scope) -> JSONResponse | None:
    """The 400 for an API call from an incompatible client (``X-API-Version``), else None."""
    path: str = scope["path"]
    if not path.startswith("/api/") or path.startswith("/api/docs"):
        return None
    value = None
    for key, raw in scope["headers"]:
        if key == b"x-api-version":
            value = raw.decode("latin-1")
            break
    bad = check_client_version(value)
    if bad is not None:
        log_rejected(scope["method"], path, 400, f"client version {value}")
    return bad


class VersionCheck:
    """ASGI middleware, outermost of the API's (after the access log and the services proxy): refuses API
    calls from an incompatible client (``X-API-Version``) before routing, answers dstack's 500 body (logging
    the traceback) for any unhandled error -- but 507, naming ``state_dir`` and its free space (or quoting
    Postgres and naming the database when its disk is the full one), for a write that failed for lack of space
    (:func:`corral.diskspace.is_disk_full`) -- and closes the connection after an
    answer given before the request's body was read (an anonymous or oversized body is never read to its end)."""

    def __init__(self, app: ASGIApp, state_dir: Path | None = None, database: str | None = None) -> None:
        self.app = app
        self.state_dir = state_dir
        #: The Postgres database, named in a 507 when its disk is the full one (``diskspace.database_label``).
        self.database = database

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self._handle(scope, receive, send)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        bad = _version_refusal(scope)
        if bad is not None:
            await bad(scope, receive, send)
            return
        started = False
        declared = _declared_length(scope)
        body_done = declared == 0
        received = 0

        async def receive_tracked() -> Message:
            nonlocal body_done, received
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            received += len(message.get("body", b""))
            return message

        async def send_tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                # answered before the body was read (401, 413, ...): a small rest is read and dropped so
                # that the client gets the answer; a large one is never read, the connection is closed
                if not body_done and not await _drain(receive_tracked, declared, received):
                    message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, receive_tracked, send_tracked)
        except Exception as e:
            error = self._unhandled(e, scope["method"], path)
            if started:
                raise
            await error(scope, receive, send)

    def _unhandled(self, e: Exception, method: str, path: str) -> JSONResponse:
        """The answer to an unhandled error: 507 for a full disk, else dstack's 500 (with the traceback logged)."""
        if self.state_dir is not None and diskspace.is_disk_full(e):
            msg = diskspace.refusal_for(self.state_dir, e, self.database)
            log.warning("%s %s refused: 507 %s", method, path, msg, extra={"event": "disk_full"})
            return JSONResponse({"detail": [{"msg": msg, "code": "error"}]}, status_code=507)
        log.exception("unhandled error on %s", path)
        return JSONResponse({"detail": [{"msg": "Internal server error", "code": "error"}]}, status_code=500)


def _refused(request: Request, status: int, msg: str) -> None:
    log_rejected(request.method, request.url.path, status, msg)


def _first_error(errors: list[dict[str, Any]]) -> str:
    if not errors:
        return "invalid request"
    first = errors[0]
    loc = ".".join(str(p) for p in first.get("loc") or ())
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{loc}: {first.get('msg')}{more}" if loc else f"{first.get('msg')}{more}"


async def _service(r: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, ServiceError)
    _refused(r, 400, f"{e.code}: {e.msg}")
    return JSONResponse({"detail": [{"msg": e.msg, "code": e.code}]}, status_code=400)


async def _storage_full(r: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, StorageFull)
    _refused(r, 507, e.msg)
    return JSONResponse({"detail": [{"msg": e.msg, "code": e.code}]}, status_code=507)


async def _forbidden(r: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, Forbidden)
    _refused(r, 403, e.msg)
    return JSONResponse({"detail": {"msg": e.msg, "code": None}}, status_code=403)


async def _access_denied(r: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, AccessDenied)
    _refused(r, 403, e.msg)
    return JSONResponse({"msg": e.msg, "code": None}, status_code=403)


async def _unauth(r: Request, _e: Exception) -> JSONResponse:
    _refused(r, 401, "not authenticated")
    return JSONResponse({"detail": "Not authenticated"}, status_code=401)


async def _no_project(r: Request, _e: Exception) -> JSONResponse:
    _refused(r, 404, "no such project")
    return JSONResponse({"detail": {"msg": "Not found", "code": None}}, status_code=404)


async def _invalid(r: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, InvalidConfiguration)
    detail = _jsonable_errors(e.errors)
    _refused(r, 422, _first_error(detail))
    return JSONResponse({"detail": detail}, status_code=422)


async def _too_large(r: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, PayloadTooLarge)
    _refused(r, 413, e.msg)
    # the rest of the body stays unread: the connection cannot serve another request
    return JSONResponse({"detail": [{"msg": e.msg, "code": "error"}]}, status_code=413, headers={"Connection": "close"})


async def _validation(r: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, RequestValidationError)
    detail = _jsonable_errors(e.errors())
    _refused(r, 422, _first_error(detail))
    return JSONResponse({"detail": detail}, status_code=422)


async def _http(r: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, StarletteHTTPException)
    _refused(r, e.status_code, str(e.detail))
    if e.status_code == 404:
        return JSONResponse({"detail": {"msg": "Not found", "code": None}}, status_code=404)
    return JSONResponse({"detail": {"msg": str(e.detail), "code": None}}, status_code=e.status_code)


def error_handlers() -> dict[Any, Callable[[Request, Exception], Awaitable[Response]]]:
    """Service errors and request errors as dstack's error bodies (the most specific class wins)."""
    return {
        ServiceError: _service,
        StorageFull: _storage_full,
        Forbidden: _forbidden,
        AccessDenied: _access_denied,
        NotAuthenticated: _unauth,
        ProjectNotFound: _no_project,
        InvalidConfiguration: _invalid,
        RequestValidationError: _validation,
        PayloadTooLarge: _too_large,
        StarletteHTTPException: _http,
    }
