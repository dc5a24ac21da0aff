"""Autoscaling without a gateway on the local backend (sandboxed ``replica_app.py`` replicas; the scaling
window shortened by ``service_scaling_window`` so nothing waits for minutes): a ``0..2`` service stays
``running`` at zero; its first requests are held until a replica is ready and then answered, those beyond
``proxy_cold_start_queue`` get a fast 503 with ``Retry-After``; under load it scales to 2, and back to 0
after ``scale_down_delay`` without traffic; a WebSocket to a service at zero is held the same way. Two
server replicas on one Postgres with the load split between them scale on the total, which their
proxies wrote once a second, not once a request."""

from __future__ import annotations

import asyncio
import base64
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import sqlalchemy as sa

from pg_harness import new_database_url
from server_harness import RunningServer, fleet_body, get_run, make_settings, running_server, wait_for
from skip_policy import needs_root

pytestmark = [
    needs_root("the job sandbox needs root (CI runs as root)"),
    pytest.mark.asyncio(loop_scope="module"),
]
APP = base64.b64encode((Path(__file__).parent / "replica_app.py").read_bytes()).decode()
QUEUE = 3


def autoscaled(name: str, replicas: str, target: float, down: str = "2s") -> dict[str, Any]:
    configuration = {
        "type": "service",
        "name": name,
        "port": 8000,
        "commands": [f"echo {APP} | base64 -d > app.py", "exec python3 app.py 8000"],
        "env": {"VERSION": "1"},
        "resources": {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."},
        "probes": [{"type": "http", "url": "/health", "interval": "1s"}],
        "replicas": replicas,
        "scaling": {"metric": "rps", "target": target, "scale_up_delay": "1s", "scale_down_delay": down},
    }
    return {"force": False, "plan": {"run_spec": {"configuration": configuration}}}


def active(run: dict[str, Any]) -> list[dict[str, Any]]:
    subs = [j["job_submissions"][-1] for j in run["jobs"]]
    return [s for s in subs if s["status"] not in ("terminated", "failed", "aborted", "done")]


def ready(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in active(run) if s["status"] == "running" and s.get("corral_ready")]


async def load(c: httpx.AsyncClient, path: str, rps: float, seconds: float) -> list[int]:
    """``rps`` requests a second for ``seconds``, each on its own (none waits for another)."""

    async def one() -> int:
        return (await c.get(path)).status_code

    tasks = []
    start = time.monotonic()
    for i in range(int(rps * seconds)):
        await asyncio.sleep(max(0.0, start + i / rps - time.monotonic()))
        tasks.append(asyncio.create_task(one()))
    return list(await asyncio.gather(*tasks))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("autoscaling")
    settings = make_settings(
        tmp,
        sandbox="on",
        service_drain_timeout=1.0,
        service_scaling_tick=0.2,
        service_scaling_window=2.0,
        proxy_cold_start_queue=QUEUE,
    )
    async with running_server(settings) as s, s.client() as c:
        r = await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..4"))
        assert r.status_code == 200, r.text
        yield s


async def test_from_zero_held_then_served_scaled_to_two_under_load_and_back_to_zero(server: RunningServer) -> None:
    async with server.client() as c:
        r = await c.post("/api/project/main/runs/apply", json=autoscaled("zero", "0..2", target=1, down="6s"))
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "running" and r.json()["jobs"] == []
        # the first requests: QUEUE held until a replica is ready and answered, the others a fast 503
        started = time.monotonic()
        first = await asyncio.gather(*(c.get("/proxy/services/main/zero/version") for _ in range(QUEUE + 2)))
        codes = sorted(x.status_code for x in first)
        assert codes == [200] * QUEUE + [503] * 2, [(x.status_code, x.text) for x in first]
        refused = [x for x in first if x.status_code == 503]
        assert all(x.headers.get("retry-after") for x in refused) and "zero replicas" in refused[0].text
        assert {x.text for x in first if x.status_code == 200} == {"1"}
        assert time.monotonic() - started < 30
        # under load (5 rps, target 1 rps a replica): two replicas, every request answered
        codes_under_load = await load(c, "/proxy/services/main/zero/version", 5, 4.0)
        assert set(codes_under_load) == {200}

        async def two() -> dict[str, Any] | None:
            run = await get_run(c, "zero")
            return run if len(ready(run)) == 2 else None

        await wait_for(two, timeout=30, interval=0.2)
        # no traffic: back to zero after the window and scale_down_delay, the run still running

        async def none_left() -> dict[str, Any] | None:
            run = await get_run(c, "zero")
            return run if not active(run) else None

        run = await wait_for(none_left, timeout=30, interval=0.3)
        assert run["status"] == "running", run["status"]
        ended = [j["job_submissions"][-1] for j in run["jobs"]]
        assert {s["termination_reason"] for s in ended} == {"scaled_down"}, ended
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["zero"], "abort": True})


async def test_a_websocket_to_a_service_at_zero_is_held_until_a_replica_is_ready(server: RunningServer) -> None:
    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, Message, Request, TextMessage

    async with server.client() as c:
        r = await c.post("/api/project/main/runs/apply", json=autoscaled("wszero", "0..1", target=10))
        assert r.status_code == 200, r.text
        host, port = server.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        ws = WSConnection(ConnectionType.CLIENT)
        auth = [(b"authorization", f"Bearer {server.token}".encode())]
        writer.write(
            ws.send(Request(host=f"{host}:{port}", target="/proxy/services/main/wszero/ws", extra_headers=auth))
        )

        async def until(kind: type) -> Any:
            while True:
                for event in ws.events():
                    if isinstance(event, kind):
                        return event
                data = await asyncio.wait_for(reader.read(65536), 60)  # the replica starting
                assert data, f"closed while waiting for {kind.__name__}"
                ws.receive_data(data)

        await until(AcceptConnection)  # held while the service scaled up from zero
        writer.write(ws.send(Message(data="hi")))
        assert (await until(TextMessage)).data == "echo:hi"
        writer.close()
        run = await get_run(c, "wszero")
        assert len(active(run)) == 1, run
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["wszero"], "abort": True})


async def test_two_server_replicas_on_postgres_scale_on_the_total(tmp_path: Path) -> None:
    url, key = new_database_url(), base64.b64encode(os.urandom(32)).decode()
    common: dict[str, Any] = dict(
        database_url=url,
        encryption_key=key,
        sandbox="on",
        service_scaling_tick=0.2,
        service_scaling_window=2.0,
        service_drain_timeout=1.0,
    )
    first, second = make_settings(tmp_path / "a", **common), make_settings(tmp_path / "b", **common)
    async with running_server(first) as a, running_server(second) as b, a.client() as on_a, b.client() as on_b:
        assert (await on_a.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..3"))).status_code == 200
        # 2.5 rps on each: alone each would size the service at ceil(2.5 / 3) = 1; together ceil(5 / 3) = 2
        r = await on_a.post("/api/project/main/runs/apply", json=autoscaled("split", "1..3", target=3, down="60s"))
        assert r.status_code == 200, r.text

        async def one() -> dict[str, Any] | None:
            run = await get_run(on_a, "split")
            return run if len(ready(run)) == 1 else None

        await wait_for(one, timeout=30, interval=0.2)
        path = "/proxy/services/main/split/version"
        loads = asyncio.gather(load(on_a, path, 2.5, 6.0), load(on_b, path, 2.5, 6.0))

        async def two() -> dict[str, Any] | None:
            run = await get_run(on_b, "split")
            return run if len(active(run)) == 2 else None

        run = await wait_for(two, timeout=20, interval=0.2)  # while the load lasts
        sent = await loads
        assert all(set(codes) == {200} for codes in sent), sent
        await asyncio.sleep(1.2)  # the last second of counts is written
        engine = a.ctx.db.engine
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    sa.text(
                        "SELECT server, count(*), sum(requests) FROM service_request_stats"
                        " WHERE run_id = :r GROUP BY server"
                    ),
                    {"r": run["id"]},
                )
            ).all()
        total = sum(int(r[2]) for r in rows)
        assert len(rows) == 2 and total == len(sent[0]) + len(sent[1]), rows
        # one row per server and second: a handful of writes for some fifteen requests on each
        assert all(int(r[1]) <= 9 for r in rows), rows
        await on_a.post("/api/project/main/runs/stop", json={"runs_names": ["split"], "abort": True})
