"""The UI's ASGI handler: its routes, the security headers on every answer, and errors as HTML pages
(403 for what the user may not do, 404, 400 for a refused form; a login redirect without a session).

It is a plain Starlette ``Router`` (not an app) so that requests keep the server's app, its context and
its access cache (``request.app.state``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.routing import Route, Router
from starlette.types import Message, Receive, Scope, Send

from corral.services.errors import Forbidden, ProjectNotFound, ResourceNotExists, ServiceError
from corral.ui import (
    auth,
    live,
    pages_accounts,
    pages_events,
    pages_models,
    pages_resources,
    pages_run_new,
    pages_runs,
    pages_volumes,
)
from corral.ui.render import HERE, SECURITY_HEADERS, page

log = logging.getLogger("corral.ui")
Handler = Callable[[Request], Awaitable[Response]]

STATIC = {
    "ui.css": "text/css; charset=utf-8",
    "ui.js": "text/javascript; charset=utf-8",
}


def _guarded(handler: Handler) -> Handler:
    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except auth.LoginRequired:
            if request.method == "GET" and not request.url.path.startswith("/ui/"):
                return auth.login_redirect(request)
            return PlainTextResponse("Log in first.", status_code=401)
        except auth.BadForm as e:
            return page(request, "error.html", status=403, title="Form refused", message=str(e))
        except (ProjectNotFound, ResourceNotExists) as e:
            msg = getattr(e, "msg", "") or "Not found"
            return page(request, "error.html", status=404, title="Not found", message=msg)
        except Forbidden as e:
            msg = "You do not have the rights to see or do this." if e.msg == "Access denied" else e.msg
            return page(request, "error.html", status=403, title="Access denied", message=msg)
        except ServiceError as e:
            return page(request, "error.html", status=400, title="Refused", message=e.msg)

    run.__name__ = handler.__name__
    return run


async def _index(request: Request) -> Response:
    """``/`` answers 200 itself, never a redirect: the runs list, or the login form without a session. (dstack's
    CLI resolves a server's URL by following ``/``'s redirects and keeps the URL it ends at.)"""
    if await auth.session_of(request) is None:
        return await auth.login_form(request)
    return await pages_runs.runs_list(request)


async def _static(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in STATIC:
        return PlainTextResponse("Not found", status_code=404)
    return FileResponse(HERE / "static" / name, media_type=STATIC[name], headers={"Cache-Control": "max-age=300"})


async def _not_found(request: Request) -> Response:
    await auth.session_of(request)
    return page(request, "error.html", status=404, title="Not found", message=f"No page at {request.url.path}.")


def _routes(feeds: live.LiveFeeds) -> list[Route]:
    get, post = ["GET"], ["POST"]
    table: list[tuple[str, Handler, list[str]]] = [
        ("/", _index, get),
        ("/login", auth.login_form, get),
        ("/login", auth.login, post),
        ("/auth/token", auth.login_form, get),
        ("/logout", auth.logout, post),
        ("/runs", pages_runs.runs_list, get),
        ("/runs/stop", pages_runs.stop_many, post),
        ("/runs/new", pages_run_new.new_run_form, get),
        ("/runs/new", pages_run_new.new_run_submit, post),
        ("/projects/{project}/runs/{run}", pages_runs.run_page, get),
        ("/projects/{project}/runs/{run}/stop", pages_runs.stop_one, post),
        ("/fleets", pages_resources.fleets_list, get),
        ("/projects/{project}/fleets/{fleet}", pages_resources.fleet_page, get),
        ("/projects/{project}/fleets/{fleet}/delete", pages_resources.fleet_delete, post),
        ("/instances", pages_resources.instances_list, get),
        ("/offers", pages_resources.offers_list, get),
        ("/volumes", pages_volumes.volumes_list, get),
        ("/models", pages_models.models_list, get),
        ("/projects/{project}/models/playground", pages_models.playground, get),
        ("/projects/{project}/volumes/{volume}/delete", pages_volumes.volume_delete, post),
        ("/projects", pages_accounts.projects_list, get),
        ("/projects/{project}", pages_accounts.project_page, get),
        ("/projects/{project}/members/add", pages_accounts.member_add, post),
        ("/projects/{project}/members/remove", pages_accounts.member_remove, post),
        ("/projects/{project}/secrets/set", pages_accounts.secret_set, post),
        ("/projects/{project}/secrets/delete", pages_accounts.secret_delete, post),
        ("/users", pages_accounts.users_list, get),
        ("/users/create", pages_accounts.user_create, post),
        ("/users/{username}/active", pages_accounts.user_set_active, post),
        ("/users/{username}/refresh_token", pages_accounts.user_refresh_token, post),
        ("/events", pages_events.events_list, get),
        ("/ui/live/runs", feeds.runs_stream, get),
        ("/ui/live/logs", feeds.logs_stream, get),
        ("/ui/logs/older", live.logs_older, get),
    ]
    routes = [Route(path, _guarded(h), methods=m) for path, h, m in table]
    routes.append(Route("/ui/static/{name}", _static, methods=get))
    return routes


def _with_headers(send: Send) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            have = {k.lower() for k, _ in message.get("headers", [])}
            extra = [
                (k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items() if k.lower().encode() not in have
            ]
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return wrapped


class UI:
    """Every request that is not the API's, the proxy's or ``/metrics``."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        #: The live streams' signals and log followers, this server's.
        self.live = live.LiveFeeds(ctx)
        self.router = Router(routes=_routes(self.live), default=self._default)

    async def _default(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        if scope["type"] != "http":
            return
        response = await _not_found(request)
        await response(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # a WebSocket under the UI's paths: nothing answers it
            return
        try:
            await self.router(scope, receive, _with_headers(send))
        except Exception:
            log.exception("UI error on %s", scope.get("path"))
            request = Request(scope, receive)
            response = page(
                request,
                "error.html",
                status=500,
                title="Server error",
                message="Something went wrong; the server's log says what.",
            )
            await response(scope, receive, _with_headers(send))
