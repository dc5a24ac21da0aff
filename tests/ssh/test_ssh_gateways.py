"""Gateways on an SSH fleet's host: a gateway holds an idle host of the fleet its ``region`` names (the
scheduler places no job there while it exists), a second gateway (by the deprecated ``create``) finds no idle host
and fails, an apply (or the deprecated ``set_wildcard_domain``) updates in place or is refused as dstack 0.22.5
refuses it, and deleting the gateway gives the host back to jobs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml
from ssh_harness import (
    SSH_SETTINGS,
    apply_fleet,
    corral_cli,
    delete_all_fleets,
    fleet_settled,
    get_fleet,
    run_get,
    run_status,
    ssh_fleet,
    submit,
)

from corral.services import gateways as gateway_services
from fakehosts import FakeHosts
from server_harness import RunningServer, make_settings, running_server, wait_for

G = "/api/project/main/gateways"


def gateway_conf(name: str, **kw: Any) -> dict[str, Any]:
    return {"type": "gateway", "name": name, "backend": "remote", "region": "edge", "domain": "example.test", **kw}


async def plan(c: httpx.AsyncClient, conf: dict[str, Any]) -> dict[str, Any]:
    r = await c.post(G + "/get_plan", json={"spec": {"configuration": conf}})
    assert r.status_code == 200, r.text
    return dict(r.json())


async def apply(c: httpx.AsyncClient, conf: dict[str, Any], current: Any = None, force: bool = False) -> httpx.Response:
    return await c.post(
        G + "/apply", json={"plan": {"spec": {"configuration": conf}, "current_resource": current}, "force": force}
    )


def detail(r: httpx.Response) -> str:
    return str(r.json()["detail"][0]["msg"])


async def gone(c: httpx.AsyncClient, name: str) -> bool:
    r = await c.post(G + "/get", json={"name": name})
    return r.status_code == 400 and r.json()["detail"][0]["code"] == "resource_not_exists"


async def test_a_gateway_holds_a_fleet_host_until_it_is_deleted(server: RunningServer, hosts: FakeHosts) -> None:
    ip = hosts.ip("cpu1")
    async with server.client() as c:
        await apply_fleet(c, ssh_fleet(hosts, "edge", [ip]))
        await wait_for(lambda: fleet_settled(c, "edge", 1), timeout=40)

        p = await plan(c, gateway_conf("gw"))
        assert (p["action"], p["current_resource"], p["user"]) == ("create", None, "admin")
        r = await apply(c, gateway_conf("gw"), p["current_resource"])
        assert r.status_code == 200, r.text
        gw = r.json()
        assert (gw["status"], gw["default"], gw["wildcard_domain"], gw["hostname"]) == (
            "submitted", True, "example.test", None
        )  # fmt: skip
        assert gw["configuration"]["default"] is True and gw["configuration"]["backend"] == "remote"
        assert [(x["hostname"], x["replica_num"], x["backend"], x["region"]) for x in gw["replicas"]] == [
            (ip, 0, "remote", "edge")
        ]
        inst = (await get_fleet(c, "edge"))["instances"][0]
        assert inst["status"] == "busy" and inst["busy_blocks"] == inst["total_blocks"]

        # the held host takes no job: a task for the fleet waits
        await submit(c, "waits", ["echo ran"], fleets=["edge"])
        await asyncio.sleep(2)
        assert (await run_get(c, "waits"))["status"] == "submitted"

        # a second gateway (by the deprecated create) finds no idle host in the fleet
        r = await c.post(G + "/create", json={"configuration": gateway_conf("gw2")})
        assert r.status_code == 200, r.text
        assert (r.json()["status"], r.json()["default"], r.json()["replicas"]) == ("failed", False, [])
        assert r.json()["status_message"] == "No idle instance in fleet edge to host the gateway"
        r = await apply(c, gateway_conf("gw2"), r.json())
        assert detail(r) == "Gateway 'gw2' is in FAILED status and cannot be updated in-place. Delete it and re-apply."

        # in place: the domain; a stale plan and a change of region are refused
        p = await plan(c, gateway_conf("gw", domain="other.test"))
        assert p["action"] == "update" and p["current_resource"]["id"] == gw["id"]
        stale = {
            **p["current_resource"],
            "configuration": {**p["current_resource"]["configuration"], "domain": "x.test"},
        }
        r = await apply(c, gateway_conf("gw", domain="other.test"), stale)
        assert detail(r) == "Failed to apply plan. Resource has been changed. Try again or use force apply."
        r = await apply(c, gateway_conf("gw", domain="other.test"), p["current_resource"])
        assert r.status_code == 200, r.text
        assert (r.json()["wildcard_domain"], r.json()["configuration"]["domain"], r.json()["default"]) == (
            "other.test", "other.test", True
        )  # fmt: skip
        r = await c.post(G + "/get_plan", json={"spec": {"configuration": gateway_conf("gw", region="nope")}})
        assert detail(r).startswith("Fleet nope not found in project main"), r.text
        p = await plan(c, gateway_conf("gw", domain="other.test", certificate=None))
        assert p["action"] == "create" and p["current_resource"]["name"] == "gw"
        r = await apply(c, gateway_conf("gw", domain="other.test", certificate=None), p["current_resource"])
        assert detail(r) == "Gateway 'gw' cannot be updated in-place. Delete it and re-apply."
        r = await apply(c, gateway_conf("gw", domain="other.test", replicas=1), None, force=True)
        assert r.status_code == 200 and r.json()["configuration"]["replicas"] == 1, r.text
        # the deprecated set_wildcard_domain changes the domain in place, checked as an apply's
        r = await c.post(G + "/set_wildcard_domain", json={"name": "gw", "wildcard_domain": "https://other.test"})
        assert detail(r).startswith("domain: 'https://other.test' is not a domain name"), r.text
        r = await c.post(G + "/set_wildcard_domain", json={"name": "gw", "wildcard_domain": "*.third.test"})
        assert r.status_code == 200, r.text
        assert (r.json()["wildcard_domain"], r.json()["configuration"]["domain"]) == ("*.third.test", "*.third.test")

        r = await c.post("/api/project/main/fleets/delete", json={"names": ["edge"]})
        assert r.status_code == 400 and "holds a gateway" in detail(r), r.text

        listed = (await c.post(G + "/list", json={})).json()
        assert [(g["name"], g["default"]) for g in listed] == [("gw", True), ("gw2", False)]
        assert (await c.post(G + "/set_default", json={"name": "gw2"})).status_code == 200
        listed = (await c.post(G + "/list", json={})).json()
        assert [(g["name"], g["default"]) for g in listed] == [("gw", False), ("gw2", True)]

        assert (await c.post(G + "/delete", json={"names": ["gw", "gw2", "unknown"]})).status_code == 200
        await wait_for(lambda: gone(c, "gw"), timeout=60)
        await wait_for(lambda: gone(c, "gw2"), timeout=60)
        await run_status(c, "waits", "done", timeout=60)  # the host is the fleet's again

        r = await c.post("/api/events/list", json={"target_gateways": [gw["id"]], "ascending": True})
        messages = [e["message"] for e in r.json()]
        assert messages[0] == "Gateway created. Status: SUBMITTED", messages
        assert "Gateway set as project default" in messages and "Gateway updated. Changed fields: domain" in messages
        assert messages[-2:] == ["Gateway marked for deletion", "Gateway deleted"], messages
        r = await c.post("/api/events/list", json={"within_gateways": [gw["id"]], "ascending": True})
        assert [e["message"] for e in r.json()] == messages


async def _running(c: httpx.AsyncClient, name: str) -> None:
    """Wait until the gateways worker has deployed the gateway on its host and it answers (``running``)."""

    async def running() -> bool:
        got = (await c.post(G + "/get", json={"name": name})).json()
        assert got["status"] != "failed", got
        return bool(got["status"] == "running")

    await wait_for(running, timeout=90, interval=0.3)


def service(name: str, **kw: Any) -> dict[str, Any]:
    small = {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."}
    return {
        "type": "service",
        "name": name,
        "port": 8000,
        "commands": ["sleep 600"],
        "fleets": ["edge"],
        "resources": small,
        **kw,
    }


async def run_apply(c: httpx.AsyncClient, conf: dict[str, Any], current: Any = None) -> httpx.Response:
    return await c.post(
        "/api/project/main/runs/apply",
        json={"plan": {"run_spec": {"configuration": conf}, "current_resource": current}, "force": False},
    )


async def test_a_service_is_published_on_its_gateway(server: RunningServer, hosts: FakeHosts) -> None:
    async with server.client() as c:
        await apply_fleet(c, ssh_fleet(hosts, "edge", [hosts.ip("cpu1")]))
        await wait_for(lambda: fleet_settled(c, "edge", 1), timeout=40)
        r = await run_apply(c, service("svc", gateway=True))
        assert detail(r) == "The service requires a gateway, but there is no default gateway in the project"
        assert r.json()["detail"][0]["code"] == "resource_not_exists"
        r = await run_apply(c, service("svc", gateway="nope"))
        assert detail(r) == "Gateway nope does not exist in project main"

        domain = "*.${{ run.project_name }}.example.test"
        r = await apply(c, gateway_conf("gw", domain=domain, certificate=None))
        assert r.status_code == 200, r.text
        gw = r.json()
        r = await c.post("/api/project/main/runs/get_plan", json={"run_spec": {"configuration": service("svc")}})
        assert detail(r) == "Gateway status is not running"  # omitted: the project's default gateway
        await _running(c, "gw")
        r = await run_apply(c, service("svc"))
        assert detail(r) == "Cannot run HTTPS service on gateway with no SSL certificates configured"

        limits = [{"prefix": "/v1", "key": {"type": "header", "header": "X-Key"}, "rps": 2, "burst": 4}]
        r = await run_apply(c, service("svc", https="auto", rate_limits=limits, model="llama"))
        assert r.status_code == 200, r.text
        assert r.json()["service"]["url"] == "http://svc.main.example.test"
        assert r.json()["service"]["model"]["base_url"] == "http://svc.main.example.test/v1"
        got = await run_get(c, "svc")
        assert (got["status"], got["service"]["url"]) == ("submitted", "http://svc.main.example.test")
        r = await c.post("/api/events/list", json={"target_runs": [got["id"]], "ascending": True})
        assert "Service assigned to gateway" in [e["message"] for e in r.json()], r.text
        registered = await gateway_services.services_to_register(server.ctx, gw["id"])
        assert [(s.run_name, s.host, s.https, s.auth, s.upstream_path) for s in registered] == [
            ("svc", "svc.main.example.test", False, True, "/proxy/services/main/svc/")
        ]
        limit = registered[0].rate_limits[0]
        assert (limit.prefix, limit.key, limit.header, limit.rps, limit.burst) == ("/v1", "header", "X-Key", 2.0, 4)
        assert registered[0].model is not None and registered[0].model.name == "llama"

        # gateway: false -> the in-server proxy; then moved onto the gateway in place
        r = await run_apply(c, service("svc2", gateway=False, https="auto"))
        assert r.status_code == 200 and r.json()["service"]["url"] == "/proxy/services/main/svc2/", r.text
        moved = service("svc2", gateway="gw", https="auto")
        p = await c.post("/api/project/main/runs/get_plan", json={"run_spec": {"configuration": moved}})
        assert p.status_code == 200, p.text
        r = await run_apply(c, moved, p.json()["current_resource"])
        assert r.status_code == 200, r.text
        assert (await run_get(c, "svc2"))["service"]["url"] == "http://svc2.main.example.test"

        r = await c.post(G + "/delete", json={"names": ["gw"]})
        assert detail(r).startswith("Gateway gw publishes services svc, svc2: stop them"), r.text
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["svc", "svc2"], "abort": True})
        await run_status(c, "svc", "terminated", "failed", "done", timeout=60)
        await run_status(c, "svc2", "terminated", "failed", "done", timeout=60)
        assert (await c.post(G + "/delete", json={"names": ["gw"]})).status_code == 200
        await wait_for(lambda: gone(c, "gw"), timeout=60)


async def test_the_corral_cli_applies_lists_updates_and_deletes_a_gateway(
    server: RunningServer, hosts: FakeHosts, tmp_path: Path
) -> None:
    ip = hosts.ip("cpu1")
    async with server.client() as c:
        await apply_fleet(c, ssh_fleet(hosts, "edge", [ip]))
        await wait_for(lambda: fleet_settled(c, "edge", 1), timeout=40)
    gw_file = tmp_path / "gw.dstack.yml"
    gw_file.write_text(yaml.safe_dump(gateway_conf("gw")))

    code, out = await corral_cli(server, tmp_path, "apply", "-f", str(gw_file), "-y", "-d")
    assert code == 0 and "Create the gateway?" not in out and "Gateway configuration submitted" in out, out
    assert "Backend" in out and "remote" in out and "Domain" in out and "example.test" in out, out
    code, out = await corral_cli(server, tmp_path, "gateway", "list", "-v")
    lines = [line.strip() for line in out.splitlines()]
    header = next(line for line in lines if line.startswith("NAME"))
    assert header.split() == ["NAME", "BACKEND", "HOSTNAME", "DOMAIN", "DEFAULT", "STATUS", "CREATED", "ERROR"]
    row = next(line for line in lines if line.startswith("gw "))
    assert row.split()[:6] == ["gw", "remote", "(edge)", ip, "example.test", "✓"], out
    assert row.split()[6] in ("submitted", "provisioning", "running"), out
    code, out = await corral_cli(server, tmp_path, "gateway", "get", "gw", "--json")
    assert code == 0 and json.loads(out)["replicas"][0]["hostname"] == ip, out
    code, out = await corral_cli(server, tmp_path, "apply", "-f", str(gw_file), "-y")
    assert code == 0 and "No configuration changes detected. Use --force to apply anyway." in out, out

    gw_file.write_text(yaml.safe_dump(gateway_conf("gw", domain="two.test")))
    code, out = await corral_cli(server, tmp_path, "apply", "-f", str(gw_file), "-y", "-d")
    assert code == 0 and "Found gateway gw. Configuration changes detected." in out, out
    code, out = await corral_cli(server, tmp_path, "gateway", "update", "gw", "--set-default", "--domain", "three.test")
    assert code == 0 and "three.test" in out, out
    code, out = await corral_cli(server, tmp_path, "gateway", "update", "gw")
    assert code == 1 and "Nothing to update: give --set-default and/or --domain D" in out, out
    code, out = await corral_cli(server, tmp_path, "gateway", "list", "-w", "--json")
    assert code == 1 and "--json cannot be used with --watch" in out, out

    # a second gateway finds no idle host: the attached apply follows it to `failed`
    other = tmp_path / "gw2.dstack.yml"
    other.write_text(yaml.safe_dump(gateway_conf("gw2")))
    code, out = await corral_cli(server, tmp_path, "apply", "-f", str(other), "-y")
    assert code == 1 and "Gateway failed: No idle instance in fleet edge to host the gateway" in out, out

    for name in ("gw2", "gw"):
        code, out = await corral_cli(server, tmp_path, "gateway", "delete", name, "-y")
        assert code == 0 and f"Gateway {name} deleted" in out, out
    code, out = await corral_cli(server, tmp_path, "gateway", "get", "gw")
    assert code == 1 and "Gateway gw does not exist in project main" in out, out


@contextlib.contextmanager
def tagging_policy() -> Iterator[str]:
    """A policy service (dstack's rest_plugin protocol) that tags every gateway ``team: <project>``."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            spec = body["spec"]
            if self.path.endswith("/on_gateway_apply"):
                spec["configuration"]["tags"] = {"team": body["project"]}
            out = json.dumps({"spec": spec, "error": None}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


async def test_a_gateways_plan_shows_the_spec_asked_and_the_one_its_policies_made(
    tmp_path: Path, hosts: FakeHosts
) -> None:
    with tagging_policy() as uri:
        settings = replace(make_settings(tmp_path, **SSH_SETTINGS), plugin_service_uri=uri)
        settings.server_dir.mkdir(parents=True)
        (settings.server_dir / "config.yml").write_text("plugins:\n  - rest_plugin\n")
        async with running_server(settings) as s, s.client() as c:
            await apply_fleet(c, ssh_fleet(hosts, "edge", [hosts.ip("cpu1")]))
            await wait_for(lambda: fleet_settled(c, "edge", 1), timeout=40)
            p = await plan(c, gateway_conf("gw"))
            assert p["spec"]["configuration"]["tags"] is None
            assert p["effective_spec"]["configuration"]["tags"] == {"team": "main"}
            r = await apply(c, gateway_conf("gw"), p["current_resource"])
            assert r.status_code == 200 and r.json()["configuration"]["tags"] == {"team": "main"}, r.text
            assert (await c.post(G + "/delete", json={"names": ["gw"]})).status_code == 200
            await wait_for(lambda: gone(c, "gw"), timeout=60)
            await delete_all_fleets(c)
