"""Rollouts of a service on the local backend (sandboxed replicas of ``replica_app.py``): a re-apply that
changes ``env`` replaces the replicas one at a time under a steady request loop that loses no request
and ends answering from the new version only (old replicas ``terminated``/``scaled_down``); a new
replica that exits at once, never passes its probe, or cannot be placed leaves the old version serving
every request, the run's status message saying why, until re-applying the previous configuration ends
the rollout without restarting anything; a field that cannot change in place is dstack's 400; an SSE
stream survives a scale-down that starts mid-stream (the replica is drained), and the drained replica
stops once its stream ended, not at the drain timeout. The model endpoint:
``/proxy/models/main/`` lists two model services and routes chat completions by the body's ``model``,
streamed too; an unknown model is dstack's 404; ``model.base_url`` answers."""

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
#: Long: a drained replica is stopped once nothing is in flight to it, so nothing here waits this out.
DRAIN = 30.0


def service_conf(name: str, version: str = "1", **conf: Any) -> dict[str, Any]:
    configuration: dict[str, Any] = {
        "type": "service",
        "name": name,
        "port": 8000,
        "commands": [f"echo {APP} | base64 -d > app.py", "exec python3 app.py 8000"],
        "env": {"VERSION": version},
        "resources": {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."},
        "probes": [{"type": "http", "url": "/health", "interval": "1s"}],
    }
    configuration.update(conf)
    return configuration


async def apply(c: httpx.AsyncClient, configuration: dict[str, Any]) -> httpx.Response:
    """``get_plan`` then ``apply`` with the plan's ``current_resource``, as the official CLI does."""
    plan = await c.post("/api/project/main/runs/get_plan", json={"run_spec": {"configuration": configuration}})
    assert plan.status_code == 200, plan.text
    body = {"plan": {"run_spec": plan.json()["run_spec"], "current_resource": plan.json()["current_resource"]}}
    return await c.post("/api/project/main/runs/apply", json={**body, "force": False})


def latest(run: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {j["job_spec"]["replica_num"]: j["job_submissions"][-1] for j in run["jobs"]}


async def serving(c: httpx.AsyncClient, name: str, count: int, deployment: int) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        run = await get_run(c, name)
        ready = [
            s
            for s in latest(run).values()
            if s["status"] == "running" and s.get("corral_ready") and s["deployment_num"] == deployment
        ]
        live = [s for s in latest(run).values() if s["status"] not in ("terminated", "failed", "aborted", "done")]
        return run if len(ready) == count and len(live) == count else None

    result: dict[str, Any] = await wait_for(check, timeout=60, interval=0.2)
    return result


class Loop:
    """Requests to ``/version`` of a service, one after another, until stopped: every answer kept."""

    def __init__(self, c: httpx.AsyncClient, name: str) -> None:
        self.c, self.path = c, f"/proxy/services/main/{name}/version"
        self.answers: list[tuple[int, str]] = []
        self._task = asyncio.create_task(self._run())
        self._stop = False

    async def _run(self) -> None:
        while not self._stop:
            r = await self.c.get(self.path)
            self.answers.append((r.status_code, r.text))
            await asyncio.sleep(0.02)

    async def stop(self) -> list[tuple[int, str]]:
        self._stop = True
        await self._task
        return self.answers

    def errors(self) -> list[tuple[int, str]]:
        return [a for a in self.answers if a[0] != 200]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("rollouts")
    settings = make_settings(tmp, sandbox="on", service_drain_timeout=DRAIN, service_scaling_tick=0.2)
    async with running_server(settings) as s, s.client() as c:
        r = await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..6"))
        assert r.status_code == 200, r.text
        yield s


async def test_a_rollout_under_load_loses_no_request_and_ends_on_the_new_version(server: RunningServer) -> None:
    async with server.client() as c:
        r = await apply(c, service_conf("roll", "1", replicas=2))
        assert r.status_code == 200, r.text
        await serving(c, "roll", 2, 0)
        loop = Loop(c, "roll")
        await asyncio.sleep(0.5)
        began = time.monotonic()
        r = await apply(c, service_conf("roll", "2", replicas=2))
        assert r.status_code == 200, r.text
        assert r.json()["deployment_num"] == 1
        run = await serving(c, "roll", 2, 1)
        # each old replica stopped once its requests were done, not at the drain timeout
        assert time.monotonic() - began < DRAIN, time.monotonic() - began
        answers = await loop.stop()
        assert not loop.errors(), loop.errors()[:5]
        assert {t for _, t in answers} <= {"1", "2"} and answers[-1][1] == "2", answers[-5:]
        tail = [await c.get("/proxy/services/main/roll/version") for _ in range(10)]
        assert {t.text for t in tail} == {"2"}
        old = [s for j in run["jobs"] for s in j["job_submissions"] if s["deployment_num"] == 0]
        await wait_for(lambda: _all_scaled_down(c, "roll"), timeout=20, interval=0.2)
        assert len(old) == 2
        events = await c.post("/api/events/list", json={"target_runs": [run["id"]]})
        assert any("Run updated. Deployment: 1." in e["message"] for e in events.json()), events.text
        # a field that cannot change in place: dstack's 400
        r = await apply(c, service_conf("roll", "2", replicas=2, auth=False))
        assert r.status_code == 400 and "Cannot override active run" in r.text, r.text
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["roll"], "abort": True})


async def test_a_rollout_on_a_full_fleet_replaces_one_replica_at_a_time_losing_no_request(
    server: RunningServer,
) -> None:
    """Two replicas on a fleet of two instances: the surge replica has no room, so the old replicas are
    replaced one at a time, one always serving, and the rollout ends on the new version."""
    async with server.client() as c:
        r = await c.post("/api/project/main/fleets/apply", json=fleet_body(name="full", nodes="0..2"))
        assert r.status_code == 200, r.text
        r = await apply(c, service_conf("tight", "1", replicas=2, fleets=["full"]))
        assert r.status_code == 200, r.text
        await serving(c, "tight", 2, 0)
        loop = Loop(c, "tight")
        await asyncio.sleep(0.5)
        r = await apply(c, service_conf("tight", "2", replicas=2, fleets=["full"]))
        assert r.status_code == 200, r.text
        await serving(c, "tight", 2, 1)
        answers = await loop.stop()
        assert not loop.errors(), loop.errors()[:5]
        assert answers[-1][1] == "2", answers[-5:]
        tail = [await c.get("/proxy/services/main/tight/version") for _ in range(10)]
        assert {t.text for t in tail} == {"2"}
        fleet = (await c.post("/api/project/main/fleets/get", json={"name": "full"})).json()
        assert sum(1 for i in fleet["instances"] if i["status"] != "terminated") <= 2
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["tight"], "abort": True})


async def _all_scaled_down(c: httpx.AsyncClient, name: str) -> bool:
    run = await get_run(c, name)
    old = [s for j in run["jobs"] for s in j["job_submissions"] if s["deployment_num"] == 0]
    return all(s["status"] == "terminated" and s["termination_reason"] == "scaled_down" for s in old)


@pytest.mark.parametrize(
    ("why", "change", "says"),
    [
        ("exits at once", {"commands": ["exit 1"]}, "failed"),
        ("never passes its probe", {"commands": ["touch sick", *service_conf("x")["commands"]]}, "its probes"),
        ("cannot be placed", {"resources": {**service_conf("x")["resources"], "gpu": "H100:8"}}, "cannot be placed"),
    ],
)  # fmt: skip
async def test_a_rollout_whose_new_replica_is_not_ready_keeps_the_old_version(
    server: RunningServer, why: str, change: dict[str, Any], says: str
) -> None:
    name = "stuck-" + why.split()[0]
    async with server.client() as c:
        r = await apply(c, service_conf(name, "1"))
        assert r.status_code == 200, r.text
        before = await serving(c, name, 1, 0)
        old_id = latest(before)[0]["id"]
        loop = Loop(c, name)
        r = await apply(c, service_conf(name, "2", **change))
        assert r.status_code == 200, r.text

        async def stuck() -> dict[str, Any] | None:
            run = await get_run(c, name)
            return run if says in (run["status_message"] or "") else None

        run = await wait_for(stuck, timeout=30, interval=0.2)
        await asyncio.sleep(2.0)  # the old version keeps serving meanwhile
        assert run["status"] == "running"
        assert latest(await get_run(c, name))[0]["id"] == old_id
        # re-applying the previous configuration ends the rollout: nothing restarts
        r = await apply(c, service_conf(name, "1"))
        assert r.status_code == 200, r.text
        after = await serving(c, name, 1, 2)
        answers = await loop.stop()
        assert not loop.errors(), loop.errors()[:5]
        assert {t for _, t in answers} == {"1"}
        assert latest(after)[0]["id"] == old_id and after["status_message"] == "running", after["status_message"]
        await c.post("/api/project/main/runs/stop", json={"runs_names": [name], "abort": True})


async def test_an_sse_stream_survives_a_scale_down_started_mid_stream(server: RunningServer) -> None:
    async with server.client() as c:
        r = await apply(c, service_conf("sse", "1", replicas=2))
        assert r.status_code == 200, r.text
        await serving(c, "sse", 2, 0)

        async def stream() -> list[str]:
            async with c.stream("GET", "/proxy/services/main/sse/long-sse?n=10", timeout=30) as resp:
                assert resp.status_code == 200
                return [line async for line in resp.aiter_lines() if line]

        streams = [asyncio.create_task(stream()) for _ in range(2)]  # one to each replica (fewest in flight)
        await asyncio.sleep(0.6)
        r = await apply(c, service_conf("sse", "1", replicas=1))  # replicas only: in place, one drained
        assert r.status_code == 200, r.text
        for got in await asyncio.gather(*streams):
            assert got[-1] == "data: [DONE]" and len(got) == 11, got
        done = time.monotonic()
        run = await serving(c, "sse", 1, 1)
        # the drained replica stopped once its stream ended, far before the drain timeout
        assert time.monotonic() - done < DRAIN / 3
        ended = [s for s in latest(run).values() if s["status"] == "terminated"]
        assert [s["termination_reason"] for s in ended] == ["scaled_down"], latest(run)
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["sse"], "abort": True})


async def test_models_route_by_name_across_services_streamed_too(server: RunningServer) -> None:
    async with server.client() as c:
        for name, model in (("llm-a", "org/a"), ("llm-b", "org/b")):
            conf = service_conf(name, "1", model=model, env={"MODEL": model})
            r = await apply(c, conf)
            assert r.status_code == 200, r.text
            assert r.json()["service"]["model"]["base_url"] == f"/proxy/services/main/{name}/v1"
        await serving(c, "llm-a", 1, 0)
        await serving(c, "llm-b", 1, 0)
        listed = await c.get("/proxy/models/main/models")
        assert listed.status_code == 200, listed.text
        assert sorted(m["id"] for m in listed.json()["data"]) == ["org/a", "org/b"]
        assert listed.json()["object"] == "list" and listed.json()["data"][0]["owned_by"] == "main"
        hi = {"messages": [{"role": "user", "content": "hi"}]}
        for model in ("org/a", "org/b"):
            r = await c.post("/proxy/models/main/chat/completions", json={**hi, "model": model})
            assert r.status_code == 200 and r.json()["model"] == model, r.text
        async with c.stream(
            "POST", "/proxy/models/main/v1/chat/completions", json={**hi, "model": "org/b", "stream": True}
        ) as s:
            lines = [line async for line in s.aiter_lines() if line]
        assert s.headers["content-type"].startswith("text/event-stream")
        assert lines[-1] == "data: [DONE]" and len(lines) == 4 and '"org/b"' in lines[0], lines
        r = await c.post("/proxy/models/main/chat/completions", json={**hi, "model": "nope"})
        assert r.status_code == 404 and r.json() == {"detail": "Model nope not found in project main"}
        async with httpx.AsyncClient(base_url=server.url) as anonymous:
            r = await anonymous.get("/proxy/models/main/models")
            assert r.status_code == 403, r.text
        # the model's own base URL, through the service's proxy path
        r = await c.post("/proxy/services/main/llm-a/v1/chat/completions", json={**hi, "model": "org/a"})
        assert r.status_code == 200 and r.json()["model"] == "org/a", r.text
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["llm-a", "llm-b"], "abort": True})
