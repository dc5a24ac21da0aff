"""Gateways on an SSH fleet's host: a gateway holds an idle host of the fleet its ``region`` names (the
scheduler places no job there while it exists), a second gateway finds no idle host and fails, an apply updates
in place or is refused as dstack 0.22.5 refuses it, and deleting the gateway gives the host back to jobs."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from ssh_harness import apply_fleet, fleet_settled, get_fleet, run_get, run_status, ssh_fleet, submit

from fakehosts import FakeHosts
from server_harness import RunningServer, wait_for

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

        # a second gateway finds no idle host in the fleet
        r = await apply(c, gateway_conf("gw2"))
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

        r = await c.post("/api/project/main/fleets/delete", json={"names": ["edge"]})
        assert r.status_code == 400 and "holds a gateway" in detail(r), r.text

        listed = (await c.post(G + "/list", json={})).json()
        assert [(g["name"], g["default"]) for g in listed] == [("gw", True), ("gw2", False)]
        assert (await c.post(G + "/set_default", json={"name": "gw2"})).status_code == 200
        listed = (await c.post(G + "/list", json={})).json()
        assert [(g["name"], g["default"]) for g in listed] == [("gw", False), ("gw2", True)]

        assert (await c.post(G + "/delete", json={"names": ["gw", "gw2", "unknown"]})).status_code == 200
        await wait_for(lambda: gone(c, "gw"), timeout=20)
        await wait_for(lambda: gone(c, "gw2"), timeout=20)
        await run_status(c, "waits", "done", timeout=60)  # the host is the fleet's again

        r = await c.post("/api/events/list", json={"target_gateways": [gw["id"]], "ascending": True})
        messages = [e["message"] for e in r.json()]
        assert messages[0] == "Gateway created. Status: SUBMITTED", messages
        assert "Gateway set as project default" in messages and "Gateway updated. Changed fields: domain" in messages
        assert messages[-2:] == ["Gateway marked for deletion", "Gateway deleted"], messages
        r = await c.post("/api/events/list", json={"within_gateways": [gw["id"]], "ascending": True})
        assert [e["message"] for e in r.json()] == messages
