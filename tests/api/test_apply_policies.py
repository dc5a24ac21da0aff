"""Apply policies (``config.yml``'s ``plugins: [rest_plugin]``): a policy service on loopback, answering as dstack's
REST plugin expects, refuses a run over 2 GPUs, tags every fleet and refuses or rewrites a gateway; one that is
down, slow or answers nonsense refuses the apply (fails closed) with a 400 naming the policy, and a refused apply
writes nothing."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from corral.config.server_config import ServerConfigError, load_server_config
from corral.server import prepare
from corral.settings import Settings, SettingsError
from server_harness import RunningServer, free_port, make_settings, running_server

# The policy service's wire shape, as dstack 0.22.5's rest_plugin sends and reads it
# (dstack/plugins/builtin/rest_plugin/_models.py): written out here, not taken from corral's code.
RUN_ENDPOINT = "/apply_policies/on_run_apply"
FLEET_ENDPOINT = "/apply_policies/on_fleet_apply"
VOLUME_ENDPOINT = "/apply_policies/on_volume_apply"
GATEWAY_ENDPOINT = "/apply_policies/on_gateway_apply"

Policy = Callable[[str, dict[str, Any]], dict[str, Any]]


def platform_policy(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """What a platform team writes: at most 2 GPUs per run, a ``team`` tag on every fleet, no volumes."""
    spec = body["spec"]
    if path == RUN_ENDPOINT:
        gpu = spec["configuration"]["resources"].get("gpu") or {}
        if (gpu.get("count") or {}).get("min", 0) > 2:
            return {"spec": spec, "error": f"{body['user']}: runs may use at most 2 GPUs"}
    elif path == FLEET_ENDPOINT:
        tags = spec["configuration"].get("tags") or {}
        spec["configuration"]["tags"] = {**tags, "team": body["project"]}
    elif path == VOLUME_ENDPOINT:
        return {"spec": spec, "error": "volumes are made by the platform team"}
    return {"spec": spec, "error": None}


@contextlib.contextmanager
def policy_service(policy: Policy, delay: float = 0.0) -> Iterator[tuple[str, list[tuple[str, dict[str, Any]]]]]:
    """A policy service on a free loopback port: its URL and the requests it received (path, body)."""
    seen: list[tuple[str, dict[str, Any]]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, body))
            time.sleep(delay)
            answer = policy(self.path, body)
            out = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def with_plugin(tmp: Path, uri: str | None, **overrides: Any) -> Settings:
    settings = replace(make_settings(tmp), plugin_service_uri=uri, **overrides)
    settings.server_dir.mkdir(parents=True)
    (settings.server_dir / "config.yml").write_text("plugins:\n  - rest_plugin\n")
    return settings


@contextlib.asynccontextmanager
async def server_with(tmp: Path, uri: str | None, **overrides: Any) -> AsyncIterator[RunningServer]:
    async with running_server(with_plugin(tmp, uri, **overrides)) as s:
        yield s


def run_body(name: str, gpu: int | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"type": "task", "name": name, "commands": ["true"], "resources": {"cpu": "1.."}}
    if gpu is not None:
        conf["resources"]["gpu"] = gpu
    return {"force": False, "plan": {"run_spec": {"configuration": conf}}}


def fleet_spec(name: str, **conf: Any) -> dict[str, Any]:
    return {"configuration": {"type": "fleet", "name": name, "nodes": "0..1", **conf}, "profile": {}}


async def run_names(c: Any) -> list[str]:
    r = await c.post("/api/runs/list", json={})
    assert r.status_code == 200, r.text
    return sorted(run["run_spec"]["run_name"] for run in r.json())


async def test_a_policy_refuses_a_run_over_two_gpus_and_tags_every_fleet(tmp_path: Path) -> None:
    with policy_service(platform_policy) as (uri, seen):
        async with server_with(tmp_path, uri) as s, s.client() as c:
            refused = await c.post("/api/project/main/runs/apply", json=run_body("big", gpu=4))
            assert refused.status_code == 400, refused.text
            msg = refused.json()["detail"][0]["msg"]
            assert "admin: runs may use at most 2 GPUs" in msg and "rest_plugin" in msg and uri in msg
            assert await run_names(c) == []  # nothing written
            plan = await c.post(
                "/api/project/main/runs/get_plan", json={"run_spec": run_body("big", 4)["plan"]["run_spec"]}
            )
            assert plan.status_code == 400 and "at most 2 GPUs" in plan.text

            ok = await c.post("/api/project/main/runs/apply", json=run_body("small", gpu=2))
            assert ok.status_code == 200, ok.text
            assert await run_names(c) == ["small"]
            await c.post("/api/project/main/runs/stop", json={"runs_names": ["small"], "abort": True})

            r = await c.post("/api/project/main/fleets/get_plan", json={"spec": fleet_spec("fl", tags={"a": "b"})})
            assert r.status_code == 200, r.text
            assert r.json()["spec"]["configuration"]["tags"] == {"a": "b"}
            assert r.json()["effective_spec"]["configuration"]["tags"] == {"a": "b", "team": "main"}
            plan_in = {"spec": fleet_spec("fl", tags={"a": "b"}), "current_resource": None}
            r = await c.post("/api/project/main/fleets/apply", json={"plan": plan_in, "force": False})
            assert r.status_code == 200, r.text
            assert r.json()["spec"]["configuration"]["tags"] == {"a": "b", "team": "main"}
            got = await c.post("/api/project/main/fleets/get", json={"name": "fl"})
            assert got.json()["spec"]["configuration"]["tags"] == {"a": "b", "team": "main"}

            volume = {
                "configuration": {"type": "volume", "name": "data", "backend": "aws", "region": "us-east-1", "size": 10}
            }
            r = await c.post("/api/project/main/volumes/create", json=volume)
            assert r.status_code == 400 and "volumes are made by the platform team" in r.text
            await c.post("/api/project/main/fleets/delete", json={"names": ["fl"]})

    paths = [p for p, _ in seen]
    assert paths[:3] == [RUN_ENDPOINT, RUN_ENDPOINT, RUN_ENDPOINT]
    assert FLEET_ENDPOINT in paths and paths[-1] == VOLUME_ENDPOINT
    body = seen[0][1]
    assert set(body) == {"user", "project", "spec"} and (body["user"], body["project"]) == ("admin", "main")
    # the spec as dstack sends it: parsed, its defaults filled in
    assert body["spec"]["configuration"]["resources"]["gpu"]["count"] == {"min": 4, "max": 4}
    assert body["spec"]["run_name"] == "big"
    assert seen[-1][1]["spec"]["configuration"]["backend"] == "aws"


def gateway_policy(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """Gateways only for the platform's domain, each on the project's own edge fleet."""
    spec = body["spec"]
    conf = spec["configuration"]
    if not str(conf.get("domain") or "").endswith(".corp.test"):
        return {"spec": spec, "error": "gateways serve *.corp.test only"}
    conf["region"] = f"edge-{body['project']}"
    return {"spec": spec, "error": None}


async def test_a_policy_refuses_or_rewrites_a_gateway(tmp_path: Path) -> None:
    g = "/api/project/main/gateways"
    gw = {"type": "gateway", "name": "gw", "backend": "remote", "region": "edge", "domain": "example.test"}
    with policy_service(gateway_policy) as (uri, seen):
        async with server_with(tmp_path, uri) as s, s.client() as c:
            for r in (
                await c.post(g + "/get_plan", json={"spec": {"configuration": gw}}),
                await c.post(g + "/apply", json={"plan": {"spec": {"configuration": gw}}, "force": False}),
                await c.post(g + "/create", json={"configuration": gw}),
            ):
                assert r.status_code == 400, r.text
                msg = r.json()["detail"][0]["msg"]
                assert "gateways serve *.corp.test only" in msg and "rest_plugin" in msg, msg
            # what the policy rewrote is what is checked: the fleet it names, not the one asked for
            ours = {**gw, "domain": "gw.corp.test"}
            r = await c.post(g + "/get_plan", json={"spec": {"configuration": ours}})
            assert r.status_code == 400 and "Fleet edge-main not found in project main" in r.text, r.text
            r = await c.post(g + "/apply", json={"plan": {"spec": {"configuration": ours}}, "force": False})
            assert r.status_code == 400 and "Fleet edge-main not found in project main" in r.text, r.text
            assert (await c.post(g + "/list", json={})).json() == []  # nothing written
    assert [p for p, _ in seen] == [GATEWAY_ENDPOINT] * 5
    body = seen[0][1]
    assert (body["user"], body["project"]) == ("admin", "main")
    sent = body["spec"]["configuration"]
    assert (sent["domain"], sent["region"]) == ("example.test", "edge")


async def test_the_run_a_policy_changes_is_the_run_planned_stored_and_run(tmp_path: Path) -> None:
    def labels(path: str, body: dict[str, Any]) -> dict[str, Any]:
        conf = body["spec"]["configuration"]
        conf["env"] = {**(conf.get("env") or {}), "TEAM": body["project"]}
        conf["max_duration"] = "1h"
        return {"spec": body["spec"], "error": None}

    with policy_service(labels) as (uri, seen):
        async with server_with(tmp_path, uri) as s, s.client() as c:
            given = run_body("labelled")["plan"]["run_spec"]
            plan = await c.post("/api/project/main/runs/get_plan", json={"run_spec": given})
            assert plan.status_code == 200, plan.text
            assert "TEAM" not in (plan.json()["run_spec"]["configuration"].get("env") or {})
            assert plan.json()["effective_run_spec"]["configuration"]["env"] == {"TEAM": "main"}
            assert plan.json()["job_plans"][0]["job_spec"]["env"]["TEAM"] == "main"
            r = await c.post("/api/project/main/runs/apply", json=run_body("labelled"))
            assert r.status_code == 200, r.text
            conf = r.json()["run_spec"]["configuration"]
            assert conf["env"] == {"TEAM": "main"} and conf["max_duration"] == 3600
            assert r.json()["jobs"][0]["job_spec"]["max_duration"] == 3600
            await c.post("/api/project/main/runs/stop", json={"runs_names": ["labelled"], "abort": True})
    assert [p for p, _ in seen] == [RUN_ENDPOINT, RUN_ENDPOINT]


async def test_an_ssh_fleets_private_keys_are_not_sent_to_the_policy_service(tmp_path: Path) -> None:
    import asyncssh

    made = asyncssh.generate_private_key("ssh-ed25519")
    private = made.export_private_key().decode()
    key = {"public": made.export_public_key().decode().strip(), "private": private}
    secret = private.splitlines()[1]  # a line of the key's body
    ssh_config = {"user": "ubuntu", "ssh_key": key, "hosts": [{"hostname": "192.0.2.10", "ssh_key": key}]}

    def clusters(path: str, body: dict[str, Any]) -> dict[str, Any]:
        body["spec"]["configuration"]["placement"] = "cluster"
        return {"spec": body["spec"], "error": None}

    with policy_service(clusters) as (uri, seen):
        async with server_with(tmp_path, uri) as s, s.client() as c:
            spec = fleet_spec("on-prem", ssh_config=ssh_config)
            del spec["configuration"]["nodes"]
            r = await c.post("/api/project/main/fleets/get_plan", json={"spec": spec})
            assert r.status_code == 200, r.text
            assert r.json()["effective_spec"]["configuration"]["placement"] == "cluster"
            assert r.json()["effective_spec"]["configuration"]["ssh_config"]["hosts"][0]["hostname"] == "192.0.2.10"
    assert seen and all(secret not in json.dumps(body) for _, body in seen)
    # a policy that gives an SSH fleet what only cloud fleets have: the refusal says the policy's spec is at fault
    with policy_service(platform_policy) as (uri, _):
        async with server_with(tmp_path / "tags", uri) as s, s.client() as c:
            r = await c.post("/api/project/main/fleets/get_plan", json={"spec": spec})
            assert r.status_code == 400, r.text
            msg = r.json()["detail"][0]["msg"]
            assert msg.startswith(f"The fleet spec that the policy service rest_plugin ({uri}) answered is not valid")
            assert "does not support the following fields: ['tags']" in msg
    assert seen[0][1]["spec"]["configuration"]["ssh_config"]["hosts"][0]["hostname"] == "192.0.2.10"


async def test_a_policy_service_that_is_down_refuses_every_apply(tmp_path: Path) -> None:
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with server_with(tmp_path, uri) as s, s.client() as c:
        r = await c.post("/api/project/main/runs/apply", json=run_body("r1"))
        assert r.status_code == 400, r.text
        msg = r.json()["detail"][0]["msg"]
        assert msg.startswith(f"Could not reach the policy rest_plugin ({uri})") and "fail closed" in msg
        r = await c.post("/api/project/main/fleets/apply", json={"plan": {"spec": fleet_spec("fl")}, "force": False})
        assert r.status_code == 400 and "Could not reach the policy rest_plugin" in r.text
        assert await run_names(c) == []
        assert (await c.post("/api/project/main/fleets/list", json={})).json() == []


async def test_a_slow_or_confused_policy_service_refuses_clearly(tmp_path: Path) -> None:
    with policy_service(platform_policy, delay=2.0) as (uri, _):
        async with server_with(tmp_path, uri, plugin_request_timeout=0.5) as s, s.client() as c:
            started = time.monotonic()
            r = await c.post("/api/project/main/runs/apply", json=run_body("r1"))
            assert r.status_code == 400 and "no answer within 0.5 s" in r.text, r.text
            assert time.monotonic() - started < 2.0

    def empty_error(path: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"spec": body["spec"], "error": ""}

    def bad_spec(path: str, body: dict[str, Any]) -> dict[str, Any]:
        body["spec"]["configuration"]["commands"] = "not a list"
        body["spec"]["configuration"]["nodes"] = 0
        return {"spec": body["spec"], "error": None}

    for policy, expected in ((empty_error, "invalid response"), (bad_spec, "The run spec that the policy service")):
        with policy_service(policy) as (uri, _):
            async with server_with(tmp_path / policy.__name__, uri) as s, s.client() as c:
                r = await c.post("/api/project/main/runs/apply", json=run_body("r1"))
                assert r.status_code == 400, r.text
                msg = r.json()["detail"][0]["msg"]
                assert expected in msg and uri in msg
                assert await run_names(c) == []


def test_config_yml_names_the_plugins_corral_has(tmp_path: Path) -> None:
    path = tmp_path / "config.yml"
    path.write_text("plugins: [rest_plugin, my_dstack_plugin]\n")
    with pytest.raises(ServerConfigError, match=r"plugins: .*unknown plugin 'my_dstack_plugin'.*rest_plugin"):
        load_server_config(path)
    path.write_text("plugins: [rest_plugin]\n")
    config = load_server_config(path)
    assert config is not None and config.plugins == ["rest_plugin"]


async def test_rest_plugin_without_its_url_does_not_start(tmp_path: Path) -> None:
    with pytest.raises(ServerConfigError, match="DSTACK_PLUGIN_SERVICE_URI"):
        await prepare(with_plugin(tmp_path, None))


def test_the_url_and_timeout_come_from_dstacks_or_corrals_variables() -> None:
    assert Settings.from_env({"DSTACK_PLUGIN_SERVICE_URI": "http://p:8000/"}).plugin_service_uri == "http://p:8000"
    both = {"DSTACK_PLUGIN_SERVICE_URI": "http://a", "CORRAL_PLUGIN_SERVICE_URI": "http://b"}
    assert Settings.from_env(both).plugin_service_uri == "http://b"
    assert Settings.from_env({}).plugin_request_timeout == 8.0  # dstack's PLUGIN_REQUEST_TIMEOUT_SEC
    assert Settings.from_env({"CORRAL_PLUGIN_REQUEST_TIMEOUT": "2"}).plugin_request_timeout == 2.0
    with pytest.raises(SettingsError, match="CORRAL_PLUGIN_SERVICE_URI='p:8000' must be an http"):
        Settings.from_env({"CORRAL_PLUGIN_SERVICE_URI": "p:8000"})
    with pytest.raises(SettingsError, match="CORRAL_PLUGIN_REQUEST_TIMEOUT"):
        Settings.from_env({"CORRAL_PLUGIN_REQUEST_TIMEOUT": "0"})
