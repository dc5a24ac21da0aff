"""The ASGI application (Starlette): the route tables, error handlers, the docs, and the workers' lifetime."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from corral import diskspace
from corral.api.deps import AccessCache, AccessLog, VersionCheck, error_handlers
from corral.api.header_limit import HeaderLimit
from corral.api.routes_accounts import router as accounts_router
from corral.api.routes_backends import router as backends_router
from corral.api.routes_compute import router as compute_router
from corral.api.routes_exports import router as exports_router
from corral.api.routes_gateways import router as gateways_router
from corral.api.routes_prometheus import router as prometheus_router
from corral.api.routes_quotas import router as quotas_router
from corral.api.routes_repos import router as repos_router
from corral.api.routes_secrets import router as secrets_router
from corral.api.routes_volumes import router as volumes_router
from corral.api.routing import IndexedRouter, RouteTable, starlette_routes
from corral.context import Context

TABLES: tuple[RouteTable, ...] = (
    accounts_router,
    backends_router,
    compute_router,
    exports_router,
    gateways_router,
    repos_router,
    secrets_router,
    prometheus_router,
    quotas_router,
    volumes_router,
)
OPENAPI_URL = "/api/openapi.json"
DOCS_URL = "/api/docs"


class Background(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def _openapi(request: Request) -> Response:
    from corral.api import openapi  # the schema machinery is imported on the first request to the docs

    return openapi.openapi_response(request.app.state, TABLES)


async def _docs(_request: Request) -> Response:
    from corral.api import openapi

    return openapi.swagger_ui(OPENAPI_URL)


class _ServiceProxy:
    """``/proxy/services/...``: corral's in-server proxy (``corral.proxy``), imported on the first request."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            from corral.proxy.app import ServiceProxy

            self._app = ServiceProxy(self.ctx)
        await self._app(scope, receive, send)


class _ProxyFirst:
    """Outermost middleware: requests under ``/proxy/services/`` and ``/proxy/models/`` go straight to the
    proxy (no API version check, no routing table: the proxy's own overhead is a measured figure)."""

    def __init__(self, app: Any, proxy: _ServiceProxy) -> None:
        self.app = app
        self.proxy = proxy

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket") and scope["path"].startswith(("/proxy/services/", "/proxy/models/")):
            await self.proxy(scope, receive, send)
        else:
            await self.app(scope, receive, send)


class _WebUI:
    """The web UI (``corral.ui``), imported on the first page request (not on the server's start path)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            from corral.ui.app import UI

            self._app = UI(self.ctx)
        await self._app(scope, receive, send)


#: Paths that are never the UI's: they answer JSON or text (their 404s too), never HTML.
NOT_UI = ("/api", "/proxy", "/metrics", "/healthcheck")


class _UIRoutes:
    """Every path that is not the API's, the proxy's, ``/metrics`` or ``/healthcheck`` is the UI's."""

    def __init__(self, app: Any, ui: _WebUI | None) -> None:
        self.app = app
        self.ui = ui

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self.ui is not None and scope["type"] == "http" and not scope["path"].startswith(NOT_UI):
            await self.ui(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def create_app(ctx: Context, workers: Background) -> Starlette:
    """The app; ``workers`` (started and stopped with it) come from the composition root."""

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        if ctx.settings.background_processing:
            await workers.start()
        try:
            yield
        finally:
            if ctx.settings.background_processing:
                await workers.stop()

    proxy = _ServiceProxy(ctx)
    docs = [
        Route(OPENAPI_URL, _openapi, include_in_schema=False),
        Route(DOCS_URL, _docs, include_in_schema=False),
        Route("/proxy/services/{rest:path}", proxy, include_in_schema=False),
        Route("/proxy/models/{rest:path}", proxy, include_in_schema=False),
    ]
    app = Starlette(
        middleware=[
            *([Middleware(AccessLog)] if ctx.settings.access_log else []),
            Middleware(HeaderLimit, limit=ctx.settings.max_header_bytes),
            Middleware(_ProxyFirst, proxy=proxy),
            Middleware(_UIRoutes, ui=_WebUI(ctx) if ctx.settings.ui else None),
            Middleware(VersionCheck, state_dir=ctx.settings.server_dir, database=diskspace.database_label(ctx.db.url)),
        ],
        exception_handlers=error_handlers(),
    )
    app.router = IndexedRouter([*starlette_routes(*TABLES), *docs], lifespan=lifespan)
    app.state.ctx = ctx
    app.state.access_cache = cache = AccessCache()
    ctx.wakeups.listen("access", cache.clear)  # another replica changed users, tokens or members
    app.state.workers = workers
    return app
