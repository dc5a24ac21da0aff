"""The proxy's parts against small in-process upstreams (no server, no database): least-in-flight choice
with rotation and passive ejection, the route cache (one load for concurrent misses, dropped on a
wake-up), the HTTP/1.1 framing, one retry on another replica when a connection fails, keep-alive
reuse, ``auth: false`` forwarding the caller's own Authorization header, and the 502 when nothing answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from corral.backends.http1 import Http1Error, Response, iter_body, read_response
from corral.context import Wakeups
from corral.domain.telemetry import Telemetry
from corral.proxy.app import ServiceProxy
from corral.proxy.balancer import Balancer
from corral.proxy.cache import Cache
from corral.settings import Settings
from server_harness import free_port


@dataclass(frozen=True)
class Rep:
    job_id: str
    replica_num: int = 0
    host_port: int = 0
    instance: Any = None


def test_least_in_flight_with_rotation_and_ejection() -> None:
    b = Balancer(failure_threshold=2, eject_for=5.0)
    reps = [Rep("a"), Rep("b"), Rep("c")]
    assert [b.pick("s", reps, 0.0).job_id for _ in range(6)] == ["a", "b", "c", "a", "b", "c"]  # type: ignore[union-attr]
    b.started("a")
    b.started("b")
    assert b.pick("s", reps, 0.0).job_id == "c"  # type: ignore[union-attr]
    b.finished("a")
    b.finished("b")
    b.connect_failed("b", 0.0)
    b.connect_failed("b", 0.0)
    assert {b.pick("s", reps, 1.0).job_id for _ in range(6)} == {"a", "c"}  # type: ignore[union-attr]
    assert "b" in {b.pick("s", reps, 6.0).job_id for _ in range(6)}  # type: ignore[union-attr]
    assert b.pick("s", reps, 0.0, exclude={"a", "b", "c"}) is None


async def test_cache_shares_one_load_and_forgets_on_clear() -> None:
    loads = 0

    async def load(key: str) -> str:
        nonlocal loads
        loads += 1
        await asyncio.sleep(0.01)
        return key.upper()

    cache: Cache[str, str] = Cache(load, ttl=60)
    assert await asyncio.gather(*(cache.get("x") for _ in range(5))) == ["X"] * 5
    assert loads == 1 and await cache.get("x") == "X" and loads == 1
    cache.clear()
    await cache.get("x")
    assert loads == 2


class _Bytes:
    def __init__(self, data: bytes) -> None:
        self.r = asyncio.StreamReader()
        self.r.feed_data(data)
        self.r.feed_eof()


async def _body(data: bytes, method: str = "GET") -> tuple[Response, bytes]:
    r = _Bytes(data).r
    resp = await read_response(r, method)
    return resp, b"".join([c async for c in iter_body(r, resp)])


async def test_http1_framing() -> None:
    resp, body = await _body(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcdef")
    assert (resp.status, body, resp.keep_alive) == (200, b"abc", True)
    resp, body = await _body(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1;x\r\nc\r\n0\r\n\r\n")
    assert body == b"abc" and resp.keep_alive
    resp, body = await _body(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 404 Nope\r\n\r\nuntil close")
    assert (resp.status, body, resp.keep_alive) == (404, b"until close", False)
    resp, body = await _body(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", "HEAD")
    assert body == b""
    for bad in (b"SSH-2.0-x\r\n\r\n", b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", b"HTTP/1.1 200"):
        with pytest.raises(Http1Error):
            await _body(bad)
    with pytest.raises(Http1Error):
        await _body(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc")


class Upstream:
    """A keep-alive HTTP/1.1 server answering ``<name> <authorization header>``; counts connections."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.connections = 0
        self.port = 0
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> Upstream:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                auth = next(
                    (
                        ln.split(b":", 1)[1].strip()
                        for ln in head.split(b"\r\n")
                        if ln.lower().startswith(b"authorization")
                    ),
                    b"-",
                )
                body = self.name.encode() + b" " + auth
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


class LocalPorts:
    async def open_port(self, instance: Any, port: int) -> tuple[Any, Any]:
        return await asyncio.open_connection("127.0.0.1", port)


def _proxy(replicas: list[Rep], auth: bool = True) -> ServiceProxy:
    ctx = SimpleNamespace(
        settings=Settings(server_dir=None, database_url=""),  # type: ignore[arg-type]
        computes={"local": LocalPorts()},
        wakeups=Wakeups(),
        telemetry=Telemetry(),
    )
    proxy = ServiceProxy(ctx)  # type: ignore[arg-type]
    route = SimpleNamespace(run_id="r", project_id="p", auth=auth, strip_prefix=True, replicas=tuple(replicas))

    async def load(key: tuple[str, str]) -> Any:
        return route

    async def member(key: tuple[str, str]) -> bool:
        return key[0] == "good"

    proxy.upstream.routes._load = load  # type: ignore[assignment]
    proxy.upstream.members._load = member  # type: ignore[assignment]
    return proxy


@pytest.fixture
async def upstreams() -> AsyncIterator[list[Upstream]]:
    ups = [await Upstream("a").start(), await Upstream("b").start()]
    yield ups
    for u in ups:
        assert u.server is not None
        u.server.close()


def _rep(job_id: str, port: int) -> Rep:
    return Rep(job_id, host_port=port, instance=SimpleNamespace(backend="local", name=job_id))


async def test_retry_on_another_replica_keep_alive_and_auth(upstreams: list[Upstream]) -> None:
    dead = free_port()  # nothing listens there
    proxy = _proxy([_rep("dead", dead), _rep("a", upstreams[0].port)])
    transport = httpx.ASGITransport(app=proxy)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://corral") as c:
        for _ in range(6):
            r = await c.get("/proxy/services/main/svc/x", headers={"Authorization": "Bearer good"})
            assert (r.status_code, r.text) == (200, "a -"), r.text  # the token is not forwarded
        assert upstreams[0].connections == 1  # one kept-alive connection for all six
        r = await c.post("/proxy/services/main/svc/x", headers={"Authorization": "Bearer good"}, content=b"x")
        assert r.status_code == 200  # a refused connection sent nothing: even a POST goes elsewhere
        r = await c.get("/proxy/services/main/svc/x", headers={"Authorization": "Bearer bad"})
        assert r.status_code == 403
    # corral_proxy_requests_total{project,run,code}: every answer of the service, by code
    (counted,) = [f.samples for f in proxy.ctx.telemetry.families() if f.name == "corral_proxy_requests_total"]
    assert [(dict(labels if isinstance(labels, tuple) else ()), value) for _, labels, value in counted] == [
        ({"project": "main", "run": "svc", "code": "200"}, 7.0),
        ({"project": "main", "run": "svc", "code": "403"}, 1.0),
    ]


async def test_auth_false_forwards_the_callers_header_and_502_when_nothing_answers(upstreams: list[Upstream]) -> None:
    proxy = _proxy([_rep("b", upstreams[1].port)], auth=False)
    transport = httpx.ASGITransport(app=proxy)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://corral") as c:
        r = await c.get("/proxy/services/main/svc/", headers={"Authorization": "Basic app-own"})
        assert (r.status_code, r.text) == (200, "b Basic app-own")
        assert (await c.get("/proxy/services/main/svc/")).status_code == 200
    proxy = _proxy([_rep("x", free_port()), _rep("y", free_port())], auth=False)
    transport = httpx.ASGITransport(app=proxy)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://corral") as c:
        r = await c.get("/proxy/services/main/svc/")
        assert r.status_code == 502 and r.json() == {"detail": "Error requesting upstream"}
