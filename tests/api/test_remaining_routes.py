"""dstack 0.22.5's remaining routes, with its shapes and rules: ``instances/get`` (members of the
instance's project, or of one its fleet is exported to), ``instances/get_instance_health_checks``,
``templates/list`` (no templates repo: empty), ``auth/list_providers`` and ``auth/get_next_redirect`` (no
OAuth2 providers, the state's redirect as dstack computes it). Roles on every route: test_rbac_matrix.py."""

from __future__ import annotations

import base64
import json
import urllib.parse
import uuid
from typing import Any

import httpx

from server_harness import RunningServer, fleet_body, wait_for


def _state(**fields: Any) -> str:
    return base64.b64encode(json.dumps(fields).encode()).decode()


async def test_instances_templates_and_auth_routes_answer_as_dstack(server: RunningServer) -> None:
    async with server.client() as admin:
        for name in ("alpha", "beta"):
            assert (await admin.post("/api/projects/create", json={"project_name": name})).status_code == 200
        r = await admin.post("/api/users/create", json={"username": "member", "global_role": "user"})
        assert r.status_code == 200, r.text
        token = (await admin.post("/api/users/get_user", json={"username": "member"})).json()["creds"]["token"]
        body = {
            "members": [{"username": "admin", "project_role": "admin"}, {"username": "member", "project_role": "user"}]
        }
        assert (await admin.post("/api/projects/beta/set_members", json=body)).status_code == 200
        r = await admin.post("/api/project/main/fleets/apply", json=fleet_body(name="shared", nodes="1"))
        assert r.status_code == 200, r.text

        async def instance() -> dict[str, Any] | None:
            found = (await admin.post("/api/instances/list", json={"project_names": ["main"]})).json()
            return found[0] if found else None

        listed = await wait_for(instance)
        # instances/list's keyset: the page after the only instance is empty, the page before it (ascending) too
        for ascending in (False, True):
            page = {"prev_created_at": listed["created"], "prev_id": listed["id"], "ascending": ascending}
            assert (await admin.post("/api/instances/list", json=page)).json() == []
        page = {"prev_created_at": listed["created"], "ascending": True}  # no id: strictly newer
        assert (await admin.post("/api/instances/list", json=page)).json() == []
        got = await admin.post("/api/project/main/instances/get", json={"id": listed["id"]})
        assert got.status_code == 200, got.text
        assert {k: got.json()[k] for k in ("id", "name", "fleet_name", "instance_num", "project_name")} == {
            k: listed[k] for k in ("id", "name", "fleet_name", "instance_num", "project_name")
        }
        # an id of another project's instance, or of none: dstack's "not found" for a member
        for project, iid in (("alpha", listed["id"]), ("main", str(uuid.uuid4()))):
            r = await admin.post(f"/api/project/{project}/instances/get", json={"id": iid})
            assert (r.status_code, r.json()) == (
                400,
                {"detail": [{"msg": "Resource not found", "code": "resource_not_exists"}]},
            ), r.text
        r = await admin.post("/api/project/main/instances/get", json={"id": "not-a-uuid"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "id"]
        r = await admin.post("/api/project/nope/instances/get", json={"id": listed["id"]})
        assert (r.status_code, r.json()) == (404, {"detail": {"msg": "Not found", "code": None}})

        checks = {"fleet_name": "shared", "instance_num": listed["instance_num"]}
        r = await admin.post("/api/project/main/instances/get_instance_health_checks", json=checks)
        assert (r.status_code, r.json()) == (200, {"health_checks": []}), r.text
        r = await admin.post(
            "/api/project/main/instances/get_instance_health_checks", json={**checks, "instance_num": 7}
        )
        assert (r.status_code, r.json()["detail"][0]["code"]) == (400, "resource_not_exists")

        assert (await admin.post("/api/project/main/templates/list")).json() == []

    async with server.client(token=token) as member:
        # not a member of main: refused, until main exports the fleet to beta, where they are
        r = await member.post("/api/project/main/instances/get", json={"id": listed["id"]})
        assert (r.status_code, r.json()) == (403, {"detail": {"msg": "Access denied", "code": None}})
        async with server.client() as admin:
            export = {"name": "to-beta", "importer_projects": ["beta"], "exported_fleets": ["shared"]}
            assert (await admin.post("/api/project/main/exports/create", json=export)).status_code == 200
        r = await member.post("/api/project/main/instances/get", json={"id": listed["id"]})
        assert r.status_code == 200 and r.json()["id"] == listed["id"], r.text
        # ... but still not what main has and does not export
        r = await member.post("/api/project/main/instances/get", json={"id": str(uuid.uuid4())})
        assert r.status_code == 403
        r = await member.post("/api/project/main/templates/list")
        assert r.status_code == 403

    async with httpx.AsyncClient(base_url=server.url) as anyone:  # no token: these need none
        assert (await anyone.post("/api/auth/list_providers")).json() == []
        url = "/api/auth/get_next_redirect"
        state = _state(value="abc", local_port=51234)
        r = await anyone.post(url, json={"code": "the code", "state": state})
        query = urllib.parse.urlencode({"code": "the code", "state": state})
        assert r.json() == {"redirect_url": f"http://localhost:51234/auth/callback?{query}"}
        r = await anyone.post(url, json={"code": "c", "state": _state(value="abc")})
        assert r.json() == {"redirect_url": None}
        for bad in ("not base64!", _state(local_port=5), _state(value="v", local_port=70000), _state(value="v", x=1)):
            r = await anyone.post(url, json={"code": "c", "state": bad})
            assert (r.status_code, r.json()) == (400, {"detail": [{"msg": "Invalid state token", "code": "error"}]})
        r = await anyone.post(url, json={"code": "c"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "state"]
