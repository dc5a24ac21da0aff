"""The in-server proxy's trusted-gateway path: a request carrying a gateway's secret in ``X-Corral-Gateway``
skips the token check, is not counted for the autoscaler (the gateway counts it) and its secret never reaches
the replica; a wrong secret is an ordinary request (403 without a token, counted with one); a gateway's
model-endpoint request is counted here (the gateway cannot tell its service), and one held at zero replicas
is counted here and its answer says so (the gateway does not count it again); the secrets are read once per
cache period, not per request."""

from __future__ import annotations

import asyncio
import base64
import hashlib
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
BASE = "/proxy/services/main/tsvc/"
SECRET = "a-gateway-secret-of-this-test"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningServer]:
    from corral.store import accounts
    from corral.store import gateways as gateway_store

    tmp = tmp_path_factory.mktemp("gwtrust")
    async with running_server(make_settings(tmp, sandbox="on")) as s, s.client() as c:
        r = await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..2"))
        assert r.status_code == 200, r.text
        conf: dict[str, Any] = {
            "type": "service", "name": "tsvc", "port": 8000, "model": "org/m",
            "commands": [f"echo {APP} | base64 -d > app.py", "exec python3 app.py 8000"],
            "resources": {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."},
        }  # fmt: skip
        r = await c.post(
            "/api/project/main/runs/apply", json={"force": False, "plan": {"run_spec": {"configuration": conf}}}
        )
        assert r.status_code == 200, r.text
        async with s.ctx.db.write() as conn:
            project = await accounts.get_project(conn, "main")
            assert project is not None
            digest = hashlib.sha256(SECRET.encode()).hexdigest()
            g_conf = {"type": "gateway", "name": "gw", "backend": "remote", "region": "f", "domain": "gw.test"}
            await gateway_store.create(conn, project.id, "gw", g_conf, digest, "sealed", time.time(), None)

        async def ready() -> bool:
            run = await get_run(c, "tsvc")
            subs = [j["job_submissions"][-1] for j in run["jobs"]]
            return any(s["status"] == "running" and s.get("corral_ready") for s in subs)

        await wait_for(ready, timeout=60, interval=0.2)
        yield s


async def counted(s: RunningServer) -> int:
    from corral.store import service_scaling

    async with s.ctx.db.read() as conn:
        run_id = await get_run_id(s)
        return (await service_scaling.requests_since(conn, [run_id], 0)).get(run_id, 0)


async def get_run_id(s: RunningServer) -> str:
    async with s.client() as c:
        return str((await get_run(c, "tsvc"))["id"])


async def test_a_gateway_request_skips_auth_is_not_counted_and_keeps_its_secret(server: RunningServer) -> None:
    before = await counted(server)
    async with httpx.AsyncClient(base_url=server.url) as anon:
        r = await anon.get(BASE + "headers", headers={"X-Corral-Gateway": SECRET})
        assert r.status_code == 200, r.text
        seen = {k.lower() for k in r.json()["headers"]}
        assert "x-corral-gateway" not in seen, seen
        await asyncio.sleep(2.2)  # the proxy writes its counts once a second
        assert await counted(server) == before

        # a wrong secret is an ordinary request: 403 without a token ...
        r = await anon.get(BASE + "whoami", headers={"X-Corral-Gateway": SECRET + "x"})
        assert r.status_code == 403, r.text
    # ... and counted with one
    async with server.client() as c:
        r = await c.get(BASE + "whoami", headers={"X-Corral-Gateway": "wrong"})
        assert r.status_code == 200, r.text

    async def one_more() -> bool:
        return await counted(server) == before + 1

    await wait_for(one_more, timeout=5)


async def test_secrets_are_read_once_per_cache_period(server: RunningServer) -> None:
    from corral.proxy.gateway_trust import GatewayTrust

    trust = GatewayTrust(server.ctx)
    right = [(b"x-corral-gateway", SECRET.encode())]
    wrong = [(b"x-corral-gateway", b"nope")]
    assert all([await trust.trusted(right) for _ in range(200)])
    assert trust.reads == 1
    assert not any([await trust.trusted(wrong) for _ in range(200)])
    assert trust.reads <= 2  # a secret not found reads again at most once a second
    assert not await trust.trusted([]) and not await trust.trusted([(b"authorization", b"Bearer x")])


async def test_a_gateway_s_model_request_is_counted_here_once(server: RunningServer) -> None:
    before = await counted(server)
    chat = {"model": "org/m", "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(base_url=server.url) as anon:
        r = await anon.post("/proxy/models/main/chat/completions", json=chat, headers={"X-Corral-Gateway": SECRET})
        assert r.status_code == 200, r.text
        assert "x-corral-counted" not in r.headers  # served by a replica: not held

    async def one_more() -> bool:
        return await counted(server) == before + 1

    await wait_for(one_more, timeout=5)
    await asyncio.sleep(1.2)
    assert await counted(server) == before + 1


async def test_a_gateway_s_request_held_at_zero_replicas_is_counted_here_and_says_so(server: RunningServer) -> None:
    conf: dict[str, Any] = {
        "type": "service", "name": "zsvc", "port": 8000, "replicas": "0..1",
        "scaling": {"metric": "rps", "target": 10, "scale_down_delay": "10m"},
        "commands": [f"echo {APP} | base64 -d > app.py", "exec python3 app.py 8000"],
        "resources": {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."},
    }  # fmt: skip
    async with server.client() as c:
        r = await c.post(
            "/api/project/main/runs/apply", json={"force": False, "plan": {"run_spec": {"configuration": conf}}}
        )
        assert r.status_code == 200, r.text
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as anon:
        r = await anon.get("/proxy/services/main/zsvc/whoami", headers={"X-Corral-Gateway": SECRET})
        assert r.status_code == 200, r.text
        assert r.headers.get("x-corral-counted") == "1", r.headers
        r = await anon.get("/proxy/services/main/zsvc/whoami", headers={"X-Corral-Gateway": SECRET})
        assert r.status_code == 200 and "x-corral-counted" not in r.headers, r.headers  # a replica now: not held
