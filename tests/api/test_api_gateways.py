"""The gateway routes' answers where no host is involved: empty lists, dstack 0.22.5's "not found" and its
refusals of what corral cannot host, each a 400 naming what to fix (a gateway's own life on an SSH fleet's
host: ``tests/ssh/test_ssh_gateways.py``)."""

from __future__ import annotations

from typing import Any

import httpx

from server_harness import RunningServer, fleet_body

G = "/api/project/main/gateways"


def conf(**kw: Any) -> dict[str, Any]:
    return {"type": "gateway", "name": "gw", "backend": "remote", "region": "edge", "domain": "example.test", **kw}


def refused(r: httpx.Response, code: str = "error") -> str:
    assert r.status_code == 400, r.text
    assert r.json()["detail"][0]["code"] == code, r.text
    return str(r.json()["detail"][0]["msg"])


async def test_no_gateway_yet(server: RunningServer) -> None:
    async with server.client() as c:
        r = await c.post(G + "/list", json={"include_imported": True})
        assert (r.status_code, r.json()) == (200, [])
        assert refused(await c.post(G + "/get", json={"name": "gw"}), "resource_not_exists") == "Resource not found"
        r = await c.post(G + "/set_default", json={"name": "gw"})
        assert refused(r, "resource_not_exists") == "Resource not found"
        r = await c.post(G + "/set_wildcard_domain", json={"name": "gw", "wildcard_domain": "a.test"})
        assert refused(r, "resource_not_exists") == "Resource not found"
        r = await c.post(G + "/delete", json={"names": ["gw"]})
        assert (r.status_code, r.json()) == (200, None)


async def test_what_corral_cannot_host_is_refused(server: RunningServer) -> None:
    async with server.client() as c:
        r = await c.post(G + "/get_plan", json={"spec": {"configuration": conf(backend="gcp")}})
        assert refused(r) == (
            "Gateways are not supported for gcp backend. Available backends with gateway support: ['remote', 'aws']"
        )
        r = await c.post(G + "/get_plan", json={"spec": {"configuration": conf(backend="aws", region="us-east-1")}})
        assert refused(r).startswith("Project main has no aws backend: a gateway with `backend: aws` runs on a VM")
        r = await c.post(
            G + "/apply", json={"plan": {"spec": {"configuration": conf(public_ip=False)}}, "force": False}
        )
        assert refused(r).startswith("Private gateways are not supported for remote backend")
        r = await c.post(G + "/get_plan", json={"spec": {"configuration": conf(domain="https://example.test/x")}})
        assert refused(r).startswith("domain: 'https://example.test/x' is not a domain name. Give one like")
        r = await c.post(G + "/create", json={"configuration": conf(replicas=3)})
        assert refused(r) == "Cannot provision 3 gateway replicas. This server allows at most 1"
        r = await c.post(G + "/get_plan", json={"spec": {"configuration": conf()}})
        assert refused(r).startswith("Fleet edge not found in project main: a gateway with `backend: remote` runs")
        assert (await c.post("/api/project/main/fleets/apply", json=fleet_body(name="edge"))).status_code == 200
        r = await c.post(G + "/get_plan", json={"spec": {"configuration": conf()}})
        assert r.status_code == 200 and r.json()["action"] == "create", r.text  # a local fleet hosts one too
        r = await c.post(G + "/get_plan", json={"spec": {"configuration": conf(bogus=1)}})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "bogus", r.text
        r = await c.post(G + "/set_default", json={"name": "gw", "gateway_project": "other"})
        assert refused(r).startswith("gateway_project: gateways of another project (other)")
