"""A WebSocket to a service through the proxy: the same route, auth, cold start from zero, drain hold and
choice of replica as a request (``proxy.app``, ``proxy.upstream``), then bridged to the replica
(``proxy.websocket``).
Imported on the first upgrade only (wsproto)."""

from __future__ import annotations

import asyncio
import logging
import time

from corral.proxy.asgi import Receive, Scope, Send, bearer_token
from corral.proxy.pool import close
from corral.proxy.upstream import PREFIX, Upstream
from corral.proxy.websocket import UpstreamRefused, bridge
from corral.services.service_routing import Route

log = logging.getLogger("corral.proxy")


async def handle(upstream: Upstream, scope: Scope, receive: Receive, send: Send) -> None:  # noqa: C901, PLR0915
    async def refuse(why: str) -> None:
        log.debug("WebSocket %s refused: %s", scope["path"], why)
        await send({"type": "websocket.close", "code": 1008})

    path: str = scope["path"]
    parts = path[len(PREFIX) :].split("/", 2)
    if len(parts) < 3 or not parts[0] or not parts[1]:
        await refuse("not a service's path")
        return
    project, run = parts[0], parts[1]
    route = await upstream.routes.get((project, run))
    if route is None or not (route.replicas or route.scales_from_zero):
        await refuse(f"Service {project}/{run} not found")
        return
    headers: list[tuple[bytes, bytes]] = list(scope["headers"])
    from_gateway = await upstream.gateways.trusted(headers)  # it checked the caller, and counts the request
    if route.auth and not from_gateway:
        token = bearer_token(headers)
        if token is None or not await upstream.members.get((token, project)):
            await refuse(f"Unauthenticated or unauthorized to access project {project}")
            return
    # counted for the autoscaler, and held while the service starts from zero, as a request is
    if not from_gateway or not route.replicas:  # held at zero replicas: counted here too (see ``Upstream.admit``)
        upstream.counter.count(route.run_id)
    if not route.replicas:
        got = await upstream.cold.wait((project, run), route)
        if not isinstance(got, Route):
            await send({"type": "websocket.close", "code": 1013})  # try again later
            return
        route = got
    prefix = f"{PREFIX}{project}/{run}"
    up_headers, _, _ = upstream.upstream_headers(scope, headers, route, prefix)
    target = "/" + parts[2] if route.strip_prefix else path
    if scope.get("query_string"):
        target += "?" + scope["query_string"].decode("latin-1")
    host = next((v.decode("latin-1") for k, v in headers if k == b"host"), "localhost")
    tried: list[str] = []
    while True:
        rep = upstream.balancer.pick(route.run_id, route.replicas, time.monotonic(), exclude=tried)
        if rep is None:
            await send({"type": "websocket.close", "code": 1011})
            return
        tried.append(rep.job_id)
        if not await upstream.drains.hold(rep.job_id):
            route = await upstream.reload_route(project, run, route)
            continue
        try:
            conn = await upstream.dial(rep)
        except (OSError, asyncio.TimeoutError, ConnectionError):
            upstream.balancer.connect_failed(rep.job_id, time.monotonic())
            continue
        upstream.balancer.started(rep.job_id)
        try:
            await bridge(conn, target, host, up_headers, list(scope.get("subprotocols") or ()), receive, send)
        except UpstreamRefused as e:
            log.debug("WebSocket to replica %d of %s: %s", rep.replica_num, prefix, e)
            await send({"type": "websocket.close", "code": 1011})
        except (OSError, ConnectionError):
            pass  # either side went away
        finally:
            upstream.balancer.finished(rep.job_id)
            upstream.drains.finished(rep.job_id)
            close(conn)
        return
