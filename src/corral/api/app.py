"""The FastAPI application: routers, error handlers, and the workers' lifetime."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

from fastapi import FastAPI

from corral.api.deps import AccessCache, install_error_handlers
from corral.api.routes_accounts import router as accounts_router
from corral.api.routes_compute import router as compute_router
from corral.api.routes_exports import router as exports_router
from corral.api.routes_repos import router as repos_router
from corral.workers.context import Context


class Background(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def create_app(ctx: Context, workers: Background) -> FastAPI:
    """The app; ``workers`` (started and stopped with it) come from the composition root."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if ctx.settings.background_processing:
            await workers.start()
        try:
            yield
        finally:
            if ctx.settings.background_processing:
                await workers.stop()

    app = FastAPI(
        title="corral",
        docs_url="/api/docs",
        openapi_url="/api/openapi.json",
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.ctx = ctx
    app.state.access_cache = AccessCache()
    app.state.workers = workers
    install_error_handlers(app)
    app.include_router(accounts_router)
    app.include_router(compute_router)
    app.include_router(exports_router)
    app.include_router(repos_router)
    return app
