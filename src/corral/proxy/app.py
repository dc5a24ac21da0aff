"""The proxy's ASGI app: ``/proxy/services/<project>/<run>[/<path>]``, every method, here; the model endpoint
(``proxy.models``) and WebSocket upgrades (``proxy.ws_route``) in modules of their own, imported on first use.
All three send requests on through one :class:`corral.proxy.upstream.Upstream`.

As dstack's in-server proxy: ``/proxy/services/<p>/<run>`` answers 308 to its trailing slash; 404
``Service <p>/<run> not found`` while the run has no ready replica (checked before auth); 403 without a
project member's token unless ``auth: false``; ``strip_prefix`` (default) forwards only the path after the
prefix; 502/504 when the replica fails or is too slow. Beyond dstack: hop-by-hop headers are dropped and
``X-Forwarded-For/Proto/Host/Prefix`` set; the ``Authorization`` header it authenticated and corral's
cookies (the UI's session too) never reach the service (and a ``Set-Cookie`` of corral's names never
reaches the caller); every answer carries ``Content-Security-Policy: sandbox ...`` (``SANDBOX_CSP``); the
replica with the fewest requests in flight is chosen; upstream connections are kept alive; a request that
could not be delivered is tried once more on another replica; bodies stream both ways; request bodies
are limited to ``proxy_body_limit`` (64 MiB) as dstack's gateway limits them (all of it ``proxy.upstream``);
WebSocket upgrades pass (``proxy.websocket``). Requests are counted for the autoscaler (``proxy.stats``); a
service at zero replicas holds them until one is ready (``proxy.cold_start``). A request a gateway of this
server forwards (``proxy.gateway_trust``) skips the token check and is not counted: the gateway did both.
"""

from __future__ import annotations

from typing import Any

from corral.context import Context
from corral.domain.telemetry import Telemetry
from corral.proxy.asgi import Receive, Scope, Send, bearer_token, json_response
from corral.proxy.stats import telling_counted
from corral.proxy.upstream import PREFIX, Upstream


def _counting(send: Send, telemetry: Telemetry, project: str, run: str) -> Send:
    """``send`` that counts the answer's status in ``corral_proxy_requests_total{project,run,code}``."""

    async def counted(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            labels = {"project": project, "run": run, "code": str(message["status"])}
            telemetry.inc("corral_proxy_requests_total", labels)
        await send(message)

    return counted


class ServiceProxy:
    """The ASGI app of ``/proxy/`` (see the module's docstring)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.upstream = Upstream(ctx)

    # ---- ASGI --------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            from corral.proxy import ws_route  # wsproto: on the first upgrade only

            await ws_route.handle(self.upstream, scope, receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if path.startswith("/proxy/models/"):
            from corral.proxy import models  # the model endpoint: on its first request only

            await models.handle(self.upstream, scope, receive, send)
            return
        parts = path[len(PREFIX) :].split("/", 2) if path.startswith(PREFIX) else []
        if len(parts) < 2 or not parts[0] or not parts[1]:
            await json_response(send, 404, {"detail": "Not Found"})
            return
        project, run = parts[0], parts[1]
        if len(parts) == 2:
            query = scope.get("query_string") or b""
            location = (path + "/").encode() + (b"?" + query if query else b"")
            await send({"type": "http.response.start", "status": 308, "headers": [(b"location", location)]})
            await send({"type": "http.response.body", "body": b""})
            return
        route = await self.upstream.routes.get((project, run))
        if route is None or not (route.replicas or route.scales_from_zero):
            await json_response(send, 404, {"detail": f"Service {project}/{run} not found"})
            return
        # counted per service that exists (never by names from a URL alone: the labels stay bounded)
        send = _counting(send, self.ctx.telemetry, project, run)
        headers: list[tuple[bytes, bytes]] = list(scope["headers"])
        # a gateway of this server has checked the caller and counts the request itself
        from_gateway = await self.upstream.gateways.trusted(headers)
        if route.auth and not from_gateway:
            token = bearer_token(headers)
            if token is None or not await self.upstream.members.get((token, project)):
                await json_response(
                    send, 403, {"detail": f"Unauthenticated or unauthorized to access project {project}"}
                )
                return
        if any(k == b"upgrade" for k, _ in headers):
            await json_response(send, 400, {"detail": "Upgrading connections is not supported"})
            return
        if from_gateway and not route.replicas:  # held, so counted here at once: the gateway must not count it
            send = telling_counted(send)
        served = await self.upstream.admit(send, (project, run), route, counted=not from_gateway)
        if served is not None:
            await self.upstream.forward(scope, receive, send, served, headers, f"{PREFIX}{project}/{run}")
