"""Services end to end on the local backend (sandboxed replicas, each listening on the service's port):
traffic reaches every replica through ``/proxy/services/<project>/<run>/``; auth and the caller's token
kept from the service; strip_prefix and the trailing-slash redirect; an SSE stream and a chunked upload
pass through; a replica whose health endpoint fails leaves traffic and comes back; ``kill -9`` of a
replica leaves the run ``running`` while a new submission replaces it; a service none of whose replicas
becomes ready ends ``failed``/``retry_limit_exceeded``."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from server_harness import RunningServer, fleet_body, get_run, make_settings, running_server, wait_for
from skip_policy import needs_root

pytestmark = [
    needs_root("the job sandbox needs root (CI runs as root)"),
    pytest.mark.asyncio(loop_scope="module"),
]
APP = base64.b64encode((Path(__file__).parent / "replica_app.py").read_bytes()).decode()
BASE = "/proxy/services/main/svc/"


def service_body(name: str, **conf: Any) -> dict[str, Any]:
    configuration: dict[str, Any] = {
        "type": "service",
        "name": name,
        "port": 8000,
        "commands": [f"echo {APP} | base64 -d > app.py", "exec python3 app.py 8000"],
        "resources": {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."},
    }
    configuration.update(conf)
    return {"force": False, "plan": {"run_spec": {"configuration": configuration}}}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("proxy")
    async with running_server(make_settings(tmp, sandbox="on")) as s, s.client() as c:
        r = await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..4"))
        assert r.status_code == 200, r.text
        body = service_body("svc", replicas=2, probes=[{"type": "http", "url": "/health", "interval": "1s"}])
        r = await c.post("/api/project/main/runs/apply", json=body)
        assert r.status_code == 200, r.text
        yield s


async def ready_replicas(c: httpx.AsyncClient, name: str = "svc") -> dict[int, dict[str, Any]]:
    """The latest submission of each replica that the proxy routes to, by replica number."""
    run = await get_run(c, name)
    out = {}
    for job in run["jobs"]:
        sub = job["job_submissions"][-1]
        if sub["status"] == "running" and sub.get("corral_ready"):
            out[job["job_spec"]["replica_num"]] = sub
    return out


async def both_ready(c: httpx.AsyncClient) -> dict[int, dict[str, Any]]:
    async def check() -> dict[int, dict[str, Any]] | None:
        got = await ready_replicas(c)
        return got if len(got) == 2 else None

    result: dict[int, dict[str, Any]] = await wait_for(check, timeout=60, interval=0.2)
    return result


async def who(c: httpx.AsyncClient, n: int) -> list[str]:
    out = []
    for _ in range(n):
        r = await c.get(BASE + "whoami")
        assert r.status_code == 200, r.text
        out.append(r.text)
    return out


async def test_traffic_reaches_every_replica_and_auth_is_required(server: RunningServer) -> None:
    async with server.client() as c:
        subs = await both_ready(c)
        assert all(s["probes"] == [{"success_streak": 1}] for s in subs.values()), subs
        seen = await who(c, 8)
        assert set(seen) == {s["id"] for s in subs.values()}, seen  # rotation over idle replicas
        run = await get_run(c, "svc")
        assert run["status"] == "running" and run["service"]["url"] == BASE
        async with httpx.AsyncClient(base_url=server.url) as anon:
            r = await anon.get(BASE + "whoami")
            assert r.status_code == 403 and r.json() == {
                "detail": "Unauthenticated or unauthorized to access project main"
            }
            r = await anon.get(BASE + "whoami", headers={"Authorization": "Bearer nope"})
            assert r.status_code == 403
            r = await anon.get("/proxy/services/main/nosuch/")
            assert r.status_code == 404 and r.json() == {"detail": "Service main/nosuch not found"}
            r = await anon.get("/proxy/services/main/svc?x=1")
            assert r.status_code == 308 and r.headers["location"] == "/proxy/services/main/svc/?x=1"


async def test_only_the_server_replica_following_a_job_probes_it(server: RunningServer) -> None:
    from corral.store import service_replicas

    async with server.client() as c:
        await both_ready(c)
    async with server.ctx.db.read() as conn:
        mine = await service_replicas.running_replicas(conn, server.ctx.replica_id)
        others = await service_replicas.running_replicas(conn, "another-server-replica")
    assert len([r for r in mine if r.run_name == "svc"]) == 2 and others == []


async def test_headers_prefix_cookies_and_the_token_stay_with_corral(server: RunningServer) -> None:
    async with server.client() as c:
        await both_ready(c)
        r = await c.get(
            BASE + "headers?a=b",
            headers={"Cookie": "corral_session=secret; app=1", "Connection": "keep-alive, X-Drop", "X-Drop": "1"},
        )
        assert r.status_code == 200, r.text
        got = r.json()
        headers = {k.lower(): v for k, v in got["headers"].items()}
        assert got["path"] == "/headers?a=b"  # strip_prefix
        assert "authorization" not in headers and "x-drop" not in headers, headers
        assert headers["cookie"] == "app=1"
        assert headers["x-forwarded-for"] == "127.0.0.1" and headers["x-forwarded-proto"] == "http"
        assert headers["x-forwarded-host"] == server.url.removeprefix("http://")
        assert headers["x-forwarded-prefix"] == "/proxy/services/main/svc"
        # the service's pages run sandboxed (an opaque origin): no use of the UI's session or the API
        assert r.headers["content-security-policy"].startswith("sandbox allow-scripts")
        assert "allow-same-origin" not in r.headers["content-security-policy"]


async def test_sse_streams_and_a_chunked_upload_passes(server: RunningServer) -> None:
    async with server.client() as c:
        await both_ready(c)
        arrivals = []
        async with c.stream("GET", BASE + "sse") as r:
            assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    arrivals.append(time.monotonic())
        assert len(arrivals) == 3
        assert arrivals[2] - arrivals[0] > 0.4, arrivals  # each event as it was sent, not the whole at the end

        async def parts() -> AsyncIterator[bytes]:
            for i in range(5):
                yield b"part%d;" % i

        r = await c.post(BASE + "echo", content=parts())
        assert r.status_code == 200 and r.content == b"part0;part1;part2;part3;part4;"
        r = await c.post(BASE + "echo", content=b"x" * 300_000)
        assert r.status_code == 200 and len(r.content) == 300_000
        # a declared body over the limit is refused before any of it is read
        host, port = server.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            f"POST {BASE}echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.token}\r\n"
            f"Content-Length: {65 * 2**20}\r\n\r\n".encode()
        )
        await writer.drain()
        status_line = await reader.readline()
        writer.close()
        assert b" 413 " in status_line, status_line


async def test_a_replica_failing_its_probes_leaves_traffic_and_comes_back(server: RunningServer) -> None:
    async with server.client() as c:
        subs = await both_ready(c)
        sick = (await c.get(BASE + "sick")).text
        sick_sub = next(s for s in subs.values() if s["id"] == sick)
        host_port = sick_sub["job_runtime_data"]["ports"]["8000"]

        async def out_of_traffic() -> bool:
            return len(await ready_replicas(c)) == 1

        await wait_for(out_of_traffic, timeout=15, interval=0.2)
        assert sick not in await who(c, 6)
        async with httpx.AsyncClient() as direct:  # the replica itself, past the proxy
            assert (await direct.get(f"http://127.0.0.1:{host_port}/well")).status_code == 200
        await both_ready(c)
        assert sick in await who(c, 6)


async def test_a_probes_method_headers_and_body_are_sent(server: RunningServer) -> None:
    # POST /probe answers 200 only to this method, header and body: a probe sent without them never passes
    probe = {"type": "http", "url": "/probe", "method": "post", "headers": [{"name": "X-Probe", "value": "yes"}]}
    body = service_body("probed", probes=[{**probe, "body": "ping", "interval": "1s", "timeout": "5s"}])
    async with server.client() as c:
        r = await c.post("/api/project/main/runs/apply", json=body)
        assert r.status_code == 200, r.text

        async def ready() -> dict[int, dict[str, Any]] | None:
            return await ready_replicas(c, "probed") or None

        await wait_for(ready, timeout=60, interval=0.2)
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["probed"], "abort": True})


async def test_kill_9_of_a_replica_keeps_the_run_running_and_a_new_one_serves(server: RunningServer) -> None:
    async with server.client() as c:
        subs = await both_ready(c)
        before = {s["id"] for s in subs.values()}
        host_port = subs[0]["job_runtime_data"]["ports"]["8000"]
        with pytest.raises(httpx.HTTPError):  # straight to the replica: a GET through the proxy is retried
            async with httpx.AsyncClient() as direct:
                await direct.get(f"http://127.0.0.1:{host_port}/die")
        statuses = set()

        async def replaced() -> dict[int, dict[str, Any]] | None:
            statuses.add((await get_run(c, "svc"))["status"])
            got = await ready_replicas(c)
            return got if len(got) == 2 and {s["id"] for s in got.values()} != before else None

        got = await wait_for(replaced, timeout=60, interval=0.2)
        assert statuses == {"running"}, statuses
        assert sorted(s["submission_num"] for s in got.values()) == [0, 1]
        assert len(set(await who(c, 6))) == 2


async def test_a_service_that_never_becomes_ready_fails(server: RunningServer) -> None:
    async with server.client() as c:
        body = service_body(
            "never",
            probes=[{"type": "http", "url": "/nope", "interval": "1s"}],
            retry={"duration": "5s"},
        )
        r = await c.post("/api/project/main/runs/apply", json=body)
        assert r.status_code == 200, r.text

        async def ended() -> dict[str, Any] | None:
            run = await get_run(c, "never")
            return run if run["status"] in ("failed", "terminated", "done") else None

        run = await wait_for(ended, timeout=40, interval=0.2)
        assert (run["status"], run["termination_reason"]) == ("failed", "retry_limit_exceeded"), run


async def test_a_websocket_echo_passes_through(server: RunningServer) -> None:
    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, CloseConnection, Message, Request, TextMessage

    async with server.client() as c:
        await both_ready(c)
    host, port = server.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    ws = WSConnection(ConnectionType.CLIENT)
    auth = [(b"authorization", f"Bearer {server.token}".encode())]
    writer.write(ws.send(Request(host=f"{host}:{port}", target=BASE + "ws", extra_headers=auth)))
    got: list[Any] = []

    async def until(kind: type) -> Any:
        while True:
            for event in ws.events():
                got.append(event)
                if isinstance(event, kind):
                    return event
            data = await asyncio.wait_for(reader.read(65536), 10)
            assert data, got
            ws.receive_data(data)

    await until(AcceptConnection)
    for text in ("hello", "x" * 1000):
        writer.write(ws.send(Message(data=text)))
        assert (await until(TextMessage)).data == "echo:" + text
    writer.write(ws.send(CloseConnection(code=1000)))
    assert (await until(CloseConnection)).code == 1000
    writer.close()
    # without a member's token the upgrade is refused
    reader, writer = await asyncio.open_connection(host, int(port))
    ws = WSConnection(ConnectionType.CLIENT)
    writer.write(ws.send(Request(host=f"{host}:{port}", target=BASE + "ws")))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 403"), head
    writer.close()


async def test_a_replica_without_room_waits_while_the_other_serves(server: RunningServer) -> None:
    """Its ``retry`` does not cover no-capacity (a task would fail at once): the replica that finds its fleet
    full waits for room, and the service runs on the replica that got one."""
    async with server.client() as c:
        fleet = fleet_body(name="single", nodes="0..1")
        assert (await c.post("/api/project/main/fleets/apply", json=fleet)).status_code == 200
        body = service_body("crowded", replicas=2, fleets=["single"], retry={"on_events": ["error"]})
        r = await c.post("/api/project/main/runs/apply", json=body)
        assert r.status_code == 200, r.text

        async def one_serving() -> dict[str, Any] | None:
            run = await get_run(c, "crowded")
            assert run["status"] not in ("failed", "terminated", "done"), run
            subs = {j["job_spec"]["replica_num"]: j["job_submissions"][-1] for j in run["jobs"]}
            return run if subs[0]["status"] == "running" and subs[0].get("corral_ready") else None

        await wait_for(one_serving, timeout=60, interval=0.2)  # its nodes are its own: it does not wait for replica 1
        await asyncio.sleep(1.0)  # the scheduler has had its passes over the waiting replica
        run = await get_run(c, "crowded")
        waiting = next(j for j in run["jobs"] if j["job_spec"]["replica_num"] == 1)["job_submissions"][-1]
        assert run["status"] == "running" and waiting["status"] == "submitted", waiting
        assert waiting["status_message"].startswith("Waiting for capacity: fleet 'single'"), waiting
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["crowded"], "abort": True})
