"""dstack's API conventions over HTTP: auth, version header, error bodies, users, projects, roles."""

from __future__ import annotations

from server_harness import RunningServer


async def test_healthcheck_and_info_need_no_token(server: RunningServer) -> None:
    async with server.client(token="x") as c:
        r = await c.get("/healthcheck")
        assert r.json() == {"status": "running"}
    import httpx

    async with httpx.AsyncClient(base_url=server.url) as c:
        info = (await c.post("/api/server/get_info")).json()
    assert info["server_version"] == "0.22.5"
    assert info["corral_version"]


async def test_auth_errors_match_dstack(server: RunningServer) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=server.url) as c:
        r = await c.post("/api/users/get_my_user")
        assert r.status_code == 401
        assert r.json() == {"detail": "Not authenticated"}
        r = await c.post("/api/users/get_my_user", headers={"Authorization": "Bearer nope"})
        assert r.status_code == 403
        assert r.json() == {"detail": {"msg": "Invalid token", "code": None}}


async def test_get_my_user_returns_creds_and_ssh_keys(server: RunningServer) -> None:
    async with server.client() as c:
        me = (await c.post("/api/users/get_my_user")).json()
    assert me["username"] == "admin"
    assert me["global_role"] == "admin"
    assert me["creds"]["token"] == server.token
    assert me["ssh_public_key"].startswith("ssh-")
    assert "PRIVATE KEY" in me["ssh_private_key"]


async def test_version_header(server: RunningServer) -> None:
    async with server.client() as c:
        ok = await c.post("/api/users/get_my_user", headers={"X-API-VERSION": "0.22.5"})
        assert ok.status_code == 200
        older = await c.post("/api/users/get_my_user", headers={"X-API-VERSION": "0.19.0"})
        assert older.status_code == 200
        newer_patch = await c.post("/api/users/get_my_user", headers={"X-API-VERSION": "0.22.9"})
        assert newer_patch.status_code == 200
        newer = await c.post("/api/users/get_my_user", headers={"X-API-VERSION": "0.23.0"})
        assert newer.status_code == 400
        assert "incompatible" in newer.json()["detail"][0]["msg"]
        bad = await c.post("/api/users/get_my_user", headers={"X-API-VERSION": "not-a-version"})
        assert bad.status_code == 400
        assert bad.json() == {"detail": [{"msg": "Invalid version: not-a-version", "code": None}]}


async def test_unknown_project_is_404_and_missing_run_is_400(server: RunningServer) -> None:
    async with server.client() as c:
        r = await c.post("/api/project/nope/runs/get", json={"run_name": "x"})
        assert r.status_code == 404
        assert r.json() == {"detail": {"msg": "Not found", "code": None}}
        r = await c.post("/api/project/main/runs/get", json={"run_name": "nope"})
        assert r.status_code == 400
        assert r.json() == {"detail": [{"msg": "Run not found", "code": "resource_not_exists"}]}


async def test_unknown_fields_and_bad_json_are_422(server: RunningServer) -> None:
    async with server.client() as c:
        r = await c.post("/api/runs/list", json={"bogus": 1})
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"] == ["body", "bogus"]
        r = await c.post("/api/runs/list", content=b"{not json", headers={"Content-Type": "application/json"})
        assert r.status_code == 422


async def test_users_and_roles(server: RunningServer) -> None:
    async with server.client() as admin:
        created = (await admin.post("/api/users/create", json={"username": "alice", "global_role": "user"})).json()
        assert created["username"] == "alice"
        dup = await admin.post("/api/users/create", json={"username": "alice", "global_role": "user"})
        assert dup.status_code == 400 and dup.json()["detail"][0]["code"] == "resource_exists"
        alice = (await admin.post("/api/users/get_user", json={"username": "alice"})).json()
        token = alice["creds"]["token"]
    async with server.client(token=token) as c:
        assert (await c.post("/api/users/get_my_user")).json()["username"] == "alice"
        # A plain user cannot create users, and is not a member of `main`.
        assert (await c.post("/api/users/create", json={"username": "bob", "global_role": "user"})).status_code == 403
        assert (await c.post("/api/project/main/runs/list", json={})).status_code == 403
        assert [u["username"] for u in (await c.post("/api/users/list")).json()] == ["alice"]
        assert (await c.post("/api/runs/list", json={})).json() == []
    async with server.client() as admin:
        r = await admin.post(
            "/api/projects/main/add_members",
            json={"members": [{"username": "alice", "project_role": "user"}]},
        )
        assert r.status_code == 200
        roles = {m["user"]["username"]: m["project_role"] for m in r.json()["members"]}
        assert roles == {"admin": "admin", "alice": "user"}
    async with server.client(token=token) as c:
        assert (await c.post("/api/project/main/runs/list", json={})).status_code == 200
        # A project user is not a manager: cannot change members.
        r = await c.post("/api/projects/main/set_members", json={"members": []})
        assert r.status_code == 403
        # ... but may leave the project.
        r = await c.post("/api/projects/main/remove_members", json={"usernames": ["alice"]})
        assert r.status_code == 200
        refreshed = (await c.post("/api/users/refresh_token", json={"username": "alice"})).json()
        assert refreshed["creds"]["token"] != token
    async with server.client() as admin:
        assert (await admin.post("/api/users/delete", json={"users": ["alice"]})).status_code == 200
        r = await admin.post("/api/users/delete", json={"users": ["admin"]})
        assert r.status_code == 400


async def test_projects_create_list_get_delete(server: RunningServer) -> None:
    async with server.client() as c:
        p = (await c.post("/api/projects/create", json={"project_name": "research"})).json()
        assert p["project_name"] == "research"
        assert p["members"][0]["project_role"] == "admin"
        names = [x["project_name"] for x in (await c.post("/api/projects/list", json={})).json()]
        assert set(names) == {"main", "research"}
        got = (await c.post("/api/projects/research/get")).json()
        assert got["project_id"] == p["project_id"]
        bad = await c.post("/api/projects/create", json={"project_name": "no spaces"})
        assert bad.status_code == 400
        assert (await c.post("/api/projects/delete", json={"projects_names": ["research"]})).status_code == 200
        assert (await c.post("/api/projects/research/get")).status_code == 404


async def test_backends_list_types(server: RunningServer) -> None:
    async with server.client() as c:
        assert (await c.post("/api/backends/list_types")).json() == ["aws", "remote", "slurm"]  # boto3 is installed


async def test_minimal_endpoints_the_official_cli_calls(server: RunningServer) -> None:
    async with server.client() as c:
        # the first start's events (newest first): admin made, then main
        assert [e["message"] for e in (await c.post("/api/events/list", json={})).json()] == [
            "Project created",
            "User created",
        ]
        assert (await c.post("/api/project/main/secrets/list", json={})).json() == []
        task = {"run_spec": {"configuration": {"type": "task", "commands": ["true"]}}}
        assert "gpus" in (await c.post("/api/project/main/gpus/list", json=task)).json()
        r = await c.post("/api/project/main/gpus/list", json={})  # dstack's ListGpusRequest needs a run_spec
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "run_spec"]
        r = await c.get("/api/project/main/metrics/job/nope")
        assert r.status_code == 400 and r.json()["detail"][0]["code"] == "resource_not_exists"
