"""`type: service` at submission: one job per replica (``replica_num`` global across groups), one job plan
per replica group, ``Run.service`` with the proxy's URL (and an OpenAI model's ``base_url``), resolved
probes in the job spec, and a 400 naming the field for what corral does not do yet."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from server_harness import RunningServer, make_settings, running_server


def service_body(**conf: Any) -> dict[str, Any]:
    configuration: dict[str, Any] = {
        "type": "service",
        "port": 8000,
        "commands": ["python3 -m http.server 8000"],
        "resources": {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."},
    }
    configuration.update(conf)
    return {"force": False, "plan": {"run_spec": {"configuration": configuration}}}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningServer]:
    tmp: Path = tmp_path_factory.mktemp("svc")
    async with running_server(make_settings(tmp, background_processing=False)) as s:
        yield s


@pytest.mark.asyncio(loop_scope="module")
async def test_apply_makes_one_job_per_replica_and_the_service_url(server: RunningServer) -> None:
    async with server.client() as c:
        r = await c.post("/api/project/main/runs/apply", json=service_body(name="svc-a", replicas=2, model="my/model"))
        assert r.status_code == 200, r.text
        run = r.json()
        assert run["status"] == "submitted" and run["deployment_num"] == 0
        assert run["service"] == {
            "url": "/proxy/services/main/svc-a/",
            "model": {"name": "my/model", "base_url": "/proxy/services/main/svc-a/v1", "type": "chat"},
            "options": {"openai": {"model": {"type": "chat", "name": "my/model", "format": "openai", "prefix": "/v1"}}},
        }
        specs = [j["job_spec"] for j in run["jobs"]]
        assert [(s["replica_num"], s["job_name"], s["replica_group"]) for s in specs] == [
            (0, "svc-a-0-0", "0"),
            (1, "svc-a-0-1", "0"),
        ]
        assert all(s["service_port"] == 8000 for s in specs)
        # an OpenAI model without `probes` gets dstack's default probe
        assert specs[0]["probes"][0]["url"] == "/v1/chat/completions" and specs[0]["probes"][0]["method"] == "post"
        got = await c.post("/api/project/main/runs/get", json={"run_name": "svc-a"})
        assert got.json()["service"]["url"] == "/proxy/services/main/svc-a/"
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["svc-a"], "abort": True})


@pytest.mark.asyncio(loop_scope="module")
async def test_groups_number_replicas_globally_and_plan_one_job_per_group(server: RunningServer) -> None:
    groups = [
        {"name": "small", "replicas": 2, "commands": ["sleep 100"]},
        {"name": "big", "count": 1, "commands": ["sleep 100"], "resources": {"cpu": "4.."}},
    ]
    body = service_body(name="svc-g", replicas=groups, probes=[{"type": "http", "url": "/health"}])
    del body["plan"]["run_spec"]["configuration"]["commands"]
    async with server.client() as c:
        plan = await c.post("/api/project/main/runs/get_plan", json={"run_spec": body["plan"]["run_spec"]})
        assert plan.status_code == 200, plan.text
        jp = plan.json()["job_plans"]
        shown = [(p["job_spec"]["replica_group"], p["job_spec"]["replica_num"]) for p in jp]
        assert shown == [("small", 0), ("big", 2)]
        run = (await c.post("/api/project/main/runs/apply", json=body)).json()
        specs = [j["job_spec"] for j in run["jobs"]]
        assert [(s["replica_num"], s["replica_group"]) for s in specs] == [(0, "small"), (1, "small"), (2, "big")]
        assert specs[2]["requirements"]["resources"]["cpu"]["count"]["min"] == 4
        assert specs[0]["probes"] == [
            {
                "type": "http",
                "url": "/health",
                "method": "get",
                "headers": [],
                "body": None,
                "timeout": 10,
                "interval": 15,
                "ready_after": 1,
                "until_ready": False,
            }
        ]
        assert run["service"] == {"url": "/proxy/services/main/svc-g/", "model": None, "options": {}}
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["svc-g"], "abort": True})


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    ("conf", "words"),
    [
        ({"gateway": "gw"}, "Gateway gw does not exist in project main"),
        ({"gateway": True}, "The service requires a gateway, but there is no default gateway in the project"),
        ({"rate_limits": [{"rps": 10}]}, "`rate_limits`"),
        ({"https": False}, "`https`"),
        ({"replicas": 0}, "at least one replica"),
        ({"model": {"name": "m", "format": "tgi"}}, "`tgi`"),
        (
            {"replicas": [{"replicas": 1, "commands": ["x"], "router": {"type": "smg"}}], "commands": []},
            "`router`",
        ),
        ({"probes": [{"type": "http", "timeout": "10m"}]}, "probes[0].timeout"),
    ],
)
async def test_what_corral_does_not_do_yet_is_a_400_naming_the_field(
    server: RunningServer, conf: dict[str, Any], words: str
) -> None:
    async with server.client() as c:
        body = service_body(name="svc-bad", **conf)
        for r in (
            await c.post("/api/project/main/runs/get_plan", json={"run_spec": body["plan"]["run_spec"]}),
            await c.post("/api/project/main/runs/apply", json=body),
        ):
            assert r.status_code == 400, r.text
            assert words in r.text, r.text
        assert (await c.post("/api/project/main/runs/get", json={"run_name": "svc-bad"})).status_code == 400


@pytest.mark.asyncio(loop_scope="module")
async def test_invalid_service_yaml_names_the_field(server: RunningServer) -> None:
    async with server.client() as c:
        r = await c.post("/api/project/main/runs/apply", json=service_body(name="svc-x", replicas="1.."))
        assert r.status_code == 422 and "maximum number of replicas is required" in r.text, r.text
        body = service_body(name="svc-x")
        del body["plan"]["run_spec"]["configuration"]["port"]
        r = await c.post("/api/project/main/runs/apply", json=body)
        assert r.status_code == 422 and "port" in r.text, r.text


@pytest.mark.asyncio(loop_scope="module")
async def test_the_user_guides_example_is_accepted(server: RunningServer) -> None:
    import yaml

    path = Path(__file__).parents[2] / "examples" / "service.dstack.yml"
    conf = yaml.safe_load(path.read_text())
    async with server.client() as c:
        r = await c.post(
            "/api/project/main/runs/apply", json={"force": False, "plan": {"run_spec": {"configuration": conf}}}
        )
        assert r.status_code == 200, r.text
        assert [j["job_spec"]["replica_num"] for j in r.json()["jobs"]] == [0, 1]
        await c.post("/api/project/main/runs/stop", json={"runs_names": [conf["name"]], "abort": True})
