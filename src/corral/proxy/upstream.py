"""The proxy's side towards a service's replicas: which replicas serve it (the route, membership and model
caches, read again when the services change), a request held while the service starts from zero replicas
(``proxy.cold_start``), the choice of replica (``proxy.balancer``) and the HTTP exchange with it over kept-alive
connections (``proxy.pool``): hop-by-hop headers dropped, ``X-Forwarded-*`` set, corral's credential and
cookies kept from the service, ``SANDBOX_CSP`` on every answer, one more try on another replica for a request
that could not be delivered, bodies streamed both ways within ``proxy_body_limit``.

The proxy's ASGI app (``proxy.app``) holds one :class:`Upstream` and hands it to its other routes
(``proxy.models``, ``proxy.ws_route``); they all use its public methods.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

from corral.backends.http1 import LAST_CHUNK, Http1Error, chunk, iter_body, read_response, request_head
from corral.backends.replica_port import open_replica
from corral.context import Context
from corral.proxy.asgi import Receive, Scope, Send, json_response
from corral.proxy.balancer import Balancer
from corral.proxy.cache import Cache
from corral.proxy.cold_start import FULL, ColdStart
from corral.proxy.drains import Drains
from corral.proxy.gateway_trust import GatewayTrust
from corral.proxy.pool import Conn, Pool, close
from corral.proxy.stats import RequestCounter
from corral.services import service_routing
from corral.services.service_routing import Replica, Route

log = logging.getLogger("corral.proxy")
#: The path prefix of services: ``/proxy/services/<project>/<run>``.
PREFIX = "/proxy/services/"

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
_SET_BY_PROXY = frozenset({b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host", b"x-forwarded-prefix"})
#: Never sent on to a replica: a gateway's secret (``proxy.gateway_trust``).
_KEPT_BACK = frozenset({b"x-corral-gateway"})
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
#: Added to every answer of a service: its pages run in a sandbox with an opaque origin, so that their
#: scripts can neither read nor use the UI's session (the cookie is ``SameSite=Strict`` and never sent for
#: them), nor read the UI's or the API's answers, though they are served on the server's origin.
SANDBOX_CSP = b"sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads"
#: Cookies of these names are corral's: never sent to a service, never set by one.
CORRAL_COOKIE_PREFIX = b"corral"
CONNECT_TIMEOUT = 10.0
#: A request body up to this size is read before it is sent (so it can be sent to another replica).
HOLD_BODY = 1 << 20
#: How long a cached route or membership may live should a wake-up be lost.
CACHE_TTL = 10.0


class _Failed(Exception):
    """The request could not be delivered to the replica (``sent``: some of it may have reached it)."""

    def __init__(self, why: str, sent: bool) -> None:
        super().__init__(why)
        self.sent = sent


def _cookies_without_corral(value: bytes) -> bytes:
    kept = [c for c in value.split(b";") if not c.strip().lower().startswith(CORRAL_COOKIE_PREFIX)]
    return b";".join(kept).strip()


class Upstream:
    """The replicas behind the proxy's routes, and the requests sent to them."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.routes: Cache[tuple[str, str], Route | None] = Cache(self._load_route, CACHE_TTL)
        self.members: Cache[tuple[str, str], bool] = Cache(self._load_member, CACHE_TTL)
        #: Each project's OpenAI models: (name, run name, submitted_at) (``proxy.models``).
        self.models: Cache[str, list[tuple[str, str, float]]] = Cache(self._load_models, CACHE_TTL)
        self.balancer = Balancer(ctx.settings.probe_failure_threshold)
        self.pool = Pool()
        self.counter = RequestCounter(ctx)
        #: Which requests come from a gateway of this server (``proxy.gateway_trust``).
        self.gateways = GatewayTrust(ctx)
        self.drains = Drains(ctx, lambda job_id: self.balancer.in_flight.get(job_id, 0))
        s = ctx.settings
        self.cold = ColdStart(
            self.routes,
            self.counter.flush_now,
            s.proxy_cold_start_queue,
            s.proxy_cold_start_timeout,
            self.counter.count,
        )
        self._service_jobs: dict[tuple[str, str], set[str]] = {}
        ctx.wakeups.listen("services", self._services_changed)
        ctx.wakeups.listen("access", self.members.clear)

    # ---- caches ------------------------------------------------------------------------------
    async def _load_route(self, key: tuple[str, str]) -> Route | None:
        route = await service_routing.route(self.ctx, *key)
        # connections to replicas no longer in the route are closed now (dstack keeps them, #2238)
        live = {r.job_id for r in route.replicas} if route else set()
        gone = self._service_jobs.get(key, set()) - live
        for job_id in gone:
            self.pool.drop(job_id)
            self.balancer.forget_one(job_id)
        self.drains.left(gone)
        self._service_jobs[key] = live
        return route

    async def _load_models(self, project: str) -> list[tuple[str, str, float]]:
        return await service_routing.models(self.ctx, project)

    async def _load_member(self, key: tuple[str, str]) -> bool:
        return await service_routing.is_member(self.ctx, *key)

    def _services_changed(self) -> None:
        self.routes.clear()
        self.models.clear()
        self.cold.changed()
        # routes with replicas this server holds are read again now, not at their next request: a drained
        # replica is released (and stopped) without waiting for traffic that may never come
        keys = [k for k, job_ids in self._service_jobs.items() if self.drains.holds_any(job_ids)]
        if keys:
            self.drains.spawn(self._reload_routes(keys))

    async def _reload_routes(self, keys: list[tuple[str, str]]) -> None:
        for key in keys:
            try:
                await self.routes.get(key)
            except Exception:
                log.debug("could not read the route of %s/%s again", *key, exc_info=True)

    # ---- requests to replicas ----------------------------------------------------------------
    async def admit(self, send: Send, key: tuple[str, str], route: Route, counted: bool = True) -> Route | None:
        """Count the request for the autoscaler (unless a gateway counts it: ``counted`` false); at zero
        replicas hold it until one is ready (None: answered already, 503 or 404). A request held at zero
        replicas is counted here in any case: it wakes the service now (and its answer tells a gateway that
        forwarded it not to count it again: ``stats.COUNTED_HEADER``)."""
        if counted or not route.replicas:
            self.counter.count(route.run_id)
        if route.replicas:
            return route
        got = await self.cold.wait(key, route)
        if got is None:
            await json_response(send, 404, {"detail": f"Service {key[0]}/{key[1]} not found"})
            return None
        if isinstance(got, str):
            why = "too many requests wait" if got == FULL else "no replica became ready in time"
            detail = f"Service {key[0]}/{key[1]} is starting from zero replicas ({why}); try again later"
            await json_response(send, 503, {"detail": detail}, [(b"retry-after", b"5")])
            return None
        return got

    def upstream_headers(  # noqa: C901
        self, scope: Scope, headers: list[tuple[bytes, bytes]], route: Route, prefix: str
    ) -> tuple[list[tuple[bytes, bytes]], int | None, bool]:
        """The headers sent on, the request's Content-Length (None: not given) and whether it is chunked."""
        named = {t.strip().lower() for k, v in headers if k == b"connection" for t in v.split(b",") if t.strip()}
        out: list[tuple[bytes, bytes]] = []
        length: int | None = None
        chunked = False
        forwarded_for = b""
        host = b""
        for k, v in headers:
            if k == b"content-length":
                try:
                    length = int(v)
                except ValueError:
                    length = -1
                continue
            if k == b"transfer-encoding":
                chunked = b"chunked" in v.lower()
                continue
            if k in HOP_BY_HOP or k in named or k in _KEPT_BACK or (k in _SET_BY_PROXY and k != b"x-forwarded-for"):
                continue
            if k == b"x-forwarded-for":
                forwarded_for = v
                continue
            if k == b"authorization" and route.auth:
                continue  # corral's credential: it stays with corral (dstack forwards it)
            if k == b"cookie":
                v = _cookies_without_corral(v)
                if not v:
                    continue
            if k == b"host":
                host = v
            out.append((k, v))
        client = scope.get("client")
        client_ip = str(client[0]).encode() if client else b""
        out.append((b"x-forwarded-for", forwarded_for + b", " + client_ip if forwarded_for else client_ip))
        out.append((b"x-forwarded-proto", str(scope.get("scheme") or "http").encode()))
        if host:
            out.append((b"x-forwarded-host", host))
        if route.strip_prefix:
            out.append((b"x-forwarded-prefix", prefix.encode()))
        return out, length, chunked

    async def forward(  # noqa: C901, PLR0915
        self, scope: Scope, receive: Receive, send: Send, route: Route, headers: list[tuple[bytes, bytes]], prefix: str
    ) -> None:
        method: str = scope["method"]
        up_headers, length, chunked = self.upstream_headers(scope, headers, route, prefix)
        limit = self.ctx.settings.proxy_body_limit
        if length is not None and (length < 0 or length > limit):
            status, msg = (400, "Invalid Content-Length") if length < 0 else (413, "Request body too large")
            await json_response(send, status, {"detail": msg})
            return
        path = scope.get("raw_path") or scope["path"].encode()
        if isinstance(path, bytes):
            path = path.decode("latin-1")
        target = path[len(prefix) :] if route.strip_prefix else path
        query = scope.get("query_string") or b""
        if query:
            target += "?" + query.decode("latin-1")
        # a body of known, small size is read whole first: held, the request can be sent again elsewhere
        body, more = b"", False
        if length or chunked:
            try:
                body, more = await self._read_held(receive, HOLD_BODY)
            except _BodyTooLarge:
                await json_response(send, 413, {"detail": "Request body too large"})
                return
            except ConnectionError:
                return
        if length is not None:
            up_headers.append((b"content-length", str(length).encode()))
        elif chunked:
            if not more:
                up_headers.append((b"content-length", str(len(body)).encode()))
            else:
                up_headers.append((b"transfer-encoding", b"chunked"))
        stream_body = more
        use_chunked = chunked and more
        head = request_head(method, target or "/", up_headers)
        tried: list[str] = []
        while True:
            rep = self.balancer.pick(route.run_id, route.replicas, time.monotonic(), exclude=tried)
            if rep is None:
                await json_response(send, 502, {"detail": "Error requesting upstream"})
                return
            tried.append(rep.job_id)
            if not await self.drains.hold(rep.job_id):  # it left rotation: this server's route was stale
                project, _, run = prefix[len(PREFIX) :].partition("/")
                route = await self.reload_route(project, run, route)
                continue
            try:
                await self._exchange(rep, method, head, body, use_chunked, receive if stream_body else None, send)
                return
            except _Failed as e:
                retry = not stream_body and (not e.sent or method in IDEMPOTENT) and len(tried) < 2
                if len(route.replicas) < 2:
                    retry = False
                log.debug("replica %s of %s: %s%s", rep.replica_num, prefix, e, " (retrying)" if retry else "")
                if not retry:
                    await json_response(send, 502, {"detail": "Error requesting upstream"})
                    return
            except asyncio.TimeoutError:
                await json_response(send, 504, {"detail": "Timed out requesting upstream"})
                return
            except _BodyTooLarge:
                await json_response(send, 413, {"detail": "Request body too large"})
                return

    async def reload_route(self, project: str, run: str, route: Route) -> Route:
        """The service's route read again (a replica in it left rotation); the old one if it is gone."""
        self.routes.forget((project, run))
        fresh = await self.routes.get((project, run))
        return route if fresh is None else dataclasses.replace(fresh, strip_prefix=route.strip_prefix)

    async def _read_held(self, receive: Receive, up_to: int) -> tuple[bytes, bool]:
        """The body's first ``up_to`` bytes or more (whole if it ends by then) and whether more is to come."""
        parts: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise ConnectionError("the caller went away")
            data = msg.get("body", b"")
            parts.append(data)
            size += len(data)
            if size > self.ctx.settings.proxy_body_limit:
                raise _BodyTooLarge
            if not msg.get("more_body"):
                return b"".join(parts), False
            if size >= up_to:
                return b"".join(parts), True

    async def dial(self, rep: Replica) -> Conn:
        return await open_replica(self.ctx.computes, rep.instance, rep.host_port, CONNECT_TIMEOUT)

    async def _exchange(
        self,
        rep: Replica,
        method: str,
        head: bytes,
        body: bytes,
        use_chunked: bool,
        more: Receive | None,
        send: Send,
    ) -> None:
        """Send the request to ``rep`` and stream its response to the caller; raises ``_Failed`` while
        nothing has been answered yet."""
        self.balancer.started(rep.job_id)
        try:
            for attempt in range(2):  # a kept-alive connection the replica closed meanwhile: once more, fresh
                try:
                    conn, reused = await self.pool.acquire(rep.job_id, lambda: self.dial(rep))
                except (OSError, asyncio.TimeoutError, ConnectionError) as e:
                    self.balancer.connect_failed(rep.job_id, time.monotonic())
                    raise _Failed(f"cannot connect: {e}", sent=False) from None
                reader, writer = conn
                try:
                    writer.write(head)
                    if body:
                        writer.write(chunk(body) if use_chunked else body)
                    if more is not None:
                        await self._send_rest(writer, more, use_chunked, len(body))
                    elif use_chunked:
                        writer.write(LAST_CHUNK)
                    await writer.drain()
                    resp = await asyncio.wait_for(read_response(reader, method), self.ctx.settings.proxy_timeout)
                except asyncio.TimeoutError:
                    close(conn)
                    raise
                except _BodyTooLarge:
                    close(conn)
                    raise
                except (Http1Error, OSError, ConnectionError) as e:
                    close(conn)
                    if reused and attempt == 0 and more is None:
                        continue
                    if not reused:
                        self.balancer.connect_failed(rep.job_id, time.monotonic())
                    raise _Failed(f"no response: {e}", sent=True) from None
                self.balancer.connected(rep.job_id)
                await self._respond(rep, conn, resp, send)
                return
        finally:
            self.balancer.finished(rep.job_id)
            self.drains.finished(rep.job_id)

    async def _send_rest(self, writer: Any, receive: Receive, use_chunked: bool, sent: int) -> None:
        limit = self.ctx.settings.proxy_body_limit
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise ConnectionError("the caller went away")
            data = msg.get("body", b"")
            sent += len(data)
            if sent > limit:
                raise _BodyTooLarge
            if data:
                writer.write(chunk(data) if use_chunked else data)
                await writer.drain()
            if not msg.get("more_body"):
                break
        if use_chunked:
            writer.write(LAST_CHUNK)

    async def _respond(self, rep: Replica, conn: Conn, resp: Any, send: Send) -> None:
        named = {t.strip().lower() for k, v in resp.headers if k == b"connection" for t in v.split(b",")}
        headers = [
            (k, v)
            for k, v in resp.headers
            if k not in HOP_BY_HOP
            and k not in named
            and not (k == b"set-cookie" and v.strip().lower().startswith(CORRAL_COOKIE_PREFIX))
        ]
        headers.append((b"content-security-policy", SANDBOX_CSP))
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        done = False
        try:
            async for data in iter_body(conn[0], resp):
                await send({"type": "http.response.body", "body": data, "more_body": True})
            done = True
        finally:
            if done and resp.keep_alive:
                self.pool.release(rep.job_id, conn)
            else:
                close(conn)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class _BodyTooLarge(Exception):
    pass
