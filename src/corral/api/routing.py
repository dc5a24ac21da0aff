"""The route table of the API: which handler answers which method and path, built into Starlette routes.

A handler is ``async def name(request, <path params>..., <query params>...) -> Response``; its argument
names say where each value comes from: ``request`` is the request, a name in the path's ``{...}`` is that
path parameter, any other name is a required query parameter (missing: 422 before the handler runs, as
FastAPI did). Handlers parse their own bodies (``parse(Model, request)``, so that authentication comes
first where it should). What a route records is for the OpenAPI document (:mod:`corral.api.openapi`,
built on the first request to the docs, never at start-up): ``body=`` the model the handler parses its
body with (a route that reads no body records ``NoBody``), ``upload=True`` a multipart upload of one
``file``, ``response=`` the name of its answer's model in :mod:`corral.schemas.responses` (a name, so
that the server's start-up imports none of them), and ``public=True`` a route that needs no token.
``limit=`` names the route's body-size limit (:data:`BODY_LIMITS`; ``request`` unless told), which
:func:`corral.api.body.read_json` applies: the endpoint puts it into the scope as ``corral.body_limit``.

Plain Starlette routes instead of FastAPI's: FastAPI analysed every handler's signature at import and
imported its OpenAPI models, which was a quarter of the server's start-up.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Route, Router
from starlette.types import Receive, Scope, Send

Handler = Callable[..., Awaitable[Response]]
H = TypeVar("H", bound=Handler)

#: A route's body-size limit -> the ``Settings`` attribute that holds it.
BODY_LIMITS = {"request": "request_body_limit", "spec": "spec_body_limit", "upload": "code_upload_limit"}
BODY_LIMIT_KEY = "corral.body_limit"

_PATH_PARAM = re.compile(r"{([A-Za-z_][A-Za-z0-9_]*)}")


class RequestValidationError(Exception):
    """A request that does not validate: answered 422 with ``{"detail": errors}`` (FastAPI's shape)."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors)
        self._errors = errors

    def errors(self) -> list[dict[str, Any]]:
        return self._errors


@dataclass(frozen=True)
class RouteSpec:
    method: str
    path: str
    handler: Handler
    body: type[Any] | None  # the request body's pydantic model, for the docs only
    response: str | None  # the answer's model in corral.schemas.responses, by name (imported by the docs only)
    public: bool  # answers without a token
    upload: bool  # a multipart/form-data upload with one ``file`` field
    path_params: tuple[str, ...]
    query_params: tuple[str, ...]
    takes_request: bool
    body_limit: str = "request"  # a key of BODY_LIMITS

    @property
    def name(self) -> str:
        return self.handler.__name__


class RouteTable:
    """Routes recorded by decorators, in order; :func:`starlette_routes` turns tables into routes."""

    def __init__(self) -> None:
        self.routes: list[RouteSpec] = []

    def get(
        self,
        path: str,
        *,
        body: type[Any] | None = None,
        response: str | None = None,
        public: bool = False,
        limit: str = "request",
    ) -> Callable[[H], H]:
        return self._add("GET", path, body, response, public, False, limit)

    def post(
        self,
        path: str,
        *,
        body: type[Any] | None = None,
        response: str | None = None,
        public: bool = False,
        upload: bool = False,
        limit: str = "request",
    ) -> Callable[[H], H]:
        return self._add("POST", path, body, response, public, upload, limit)

    def _add(
        self,
        method: str,
        path: str,
        body: type[Any] | None,
        response: str | None,
        public: bool,
        upload: bool,
        limit: str,
    ) -> Callable[[H], H]:
        if limit not in BODY_LIMITS:
            raise ValueError(f"unknown body limit {limit!r}: one of {sorted(BODY_LIMITS)}")

        def decorator(handler: H) -> H:
            code = getattr(handler, "__code__")  # noqa: B009 - a plain function's arguments, cheaply
            args = code.co_varnames[: code.co_argcount]
            in_path = set(_PATH_PARAM.findall(path))
            self.routes.append(
                RouteSpec(
                    method=method,
                    path=path,
                    handler=handler,
                    body=body,
                    response=response,
                    public=public,
                    upload=upload,
                    path_params=tuple(a for a in args if a in in_path),
                    query_params=tuple(a for a in args if a != "request" and a not in in_path),
                    takes_request="request" in args,
                    body_limit=limit,
                )
            )
            return handler

        return decorator


def _endpoint(spec: RouteSpec) -> Callable[[Request], Awaitable[Response]]:
    handler, path_params, query_params, takes_request, limit = (
        spec.handler,
        spec.path_params,
        spec.query_params,
        spec.takes_request,
        spec.body_limit,
    )
    if not path_params and not query_params:
        if takes_request:

            async def with_request(request: Request) -> Response:
                request.scope[BODY_LIMIT_KEY] = limit
                return await handler(request)

            return with_request

        async def no_arguments(_request: Request) -> Response:
            return await handler()

        return no_arguments

    async def endpoint(request: Request) -> Response:
        kwargs: dict[str, Any] = {name: request.path_params[name] for name in path_params}
        if query_params:
            missing = []
            for name in query_params:
                value = request.query_params.get(name)
                if value is None:
                    missing.append({"type": "missing", "loc": ["query", name], "msg": "Field required", "input": None})
                kwargs[name] = value
            if missing:
                raise RequestValidationError(missing)
        if takes_request:
            request.scope[BODY_LIMIT_KEY] = limit
            kwargs["request"] = request
        return await handler(**kwargs)

    return endpoint


def starlette_routes(*tables: RouteTable) -> list[Route]:
    """One Starlette route per recorded route, answering exactly its method (no implicit HEAD: a HEAD
    or any other method is a 405, as before)."""
    out = []
    for table in tables:
        for spec in table.routes:
            route = Route(spec.path, _endpoint(spec), methods=[spec.method], name=spec.name)
            route.methods = {spec.method}
            out.append(route)
    return out


class IndexedRouter(Router):
    """Starlette's router, which tries the routes in order with a regular expression each until one matches (about
    45 of them for a ``runs/get``, some 30 µs of CPU per request), first narrowed by the path's last segment: only the
    routes whose path ends with that segment, or with a parameter (and any route that is not a plain :class:`Route`),
    are tried, in their order. A path a route ending with another literal segment cannot match, so the first full
    match among them is the one Starlette's scan takes; with none (a 404, a 405, a redirect of a trailing slash, a
    root path) Starlette's own scan answers."""

    _index: dict[str, list[BaseRoute]]
    _anywhere: list[BaseRoute]
    _indexed = -1  # how many routes the index holds: rebuilt if routes are added

    def candidates(self, last: str) -> list[BaseRoute]:
        """The routes a path whose last segment is ``last`` may match, in order."""
        if self._indexed != len(self.routes):
            ends = [_literal_end(route) for route in self.routes]
            self._anywhere = [route for route, end in zip(self.routes, ends, strict=True) if end is None]
            self._index = {
                key: [route for route, end in zip(self.routes, ends, strict=True) if end in (key, None)]
                for key in {end for end in ends if end is not None}
            }
            self._indexed = len(self.routes)
        return self._index.get(last, self._anywhere)

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            for route in self.candidates(scope["path"].rpartition("/")[2]):
                match, child_scope = route.matches(scope)
                if match == Match.FULL:
                    if "router" not in scope:
                        scope["router"] = self
                    scope["route"] = route
                    scope.update(child_scope)
                    await route.handle(scope, receive, send)
                    return
        await super().app(scope, receive, send)


def _literal_end(route: BaseRoute) -> str | None:
    """The last segment of a plain route's path when it is literal (None: a parameter, or not a plain route)."""
    if type(route) is not Route:
        return None
    last = route.path.rpartition("/")[2]
    return None if "{" in last else last
