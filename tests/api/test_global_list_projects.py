"""The projects a global list covers (``/api/runs/list``, which ``dstack ps`` polls; fleets, instances, volumes) are
remembered per caller for a second (``api/deps.py:AccessCache``), like the caller's token and role, and forgotten at
once when members or projects change."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import httpx
from starlette.requests import Request

from corral.api.deps import AccessCache
from corral.services import accounts, members
from server_harness import RunningServer, task_body


async def _user(admin: httpx.AsyncClient, name: str) -> str:
    r = await admin.post("/api/users/create", json={"username": name, "global_role": "user"})
    assert r.status_code == 200, r.text
    return str((await admin.post("/api/users/get_user", json={"username": name})).json()["creds"]["token"])


def _members(*pairs: tuple[str, str]) -> dict[str, Any]:
    return {"members": [{"username": u, "project_role": r} for u, r in pairs]}


async def _listed(c: httpx.AsyncClient, **body: Any) -> list[str]:
    r = await c.post("/api/runs/list", json=body)
    assert r.status_code == 200, r.text
    return [run["run_spec"]["run_name"] for run in r.json()]


async def test_a_members_global_list_follows_membership_at_once(server: RunningServer) -> None:
    async with server.client() as admin:
        assert (await admin.post("/api/projects/create", json={"project_name": "team"})).status_code == 200
        r = await admin.post("/api/project/team/runs/apply", json=task_body(["true"], name="team-run"))
        assert r.status_code == 200, r.text
        token = await _user(admin, "dev")
        async with server.client(token) as dev:
            assert await _listed(dev) == [] and await _listed(dev, project_name="team") == []
            r = await admin.post("/api/projects/team/add_members", json=_members(("admin", "admin"), ("dev", "user")))
            assert r.status_code == 200, r.text
            assert await _listed(dev) == ["team-run"]
            assert await _listed(dev, project_name="team") == ["team-run"]
            assert await _listed(dev, project_name="main") == []
            r = await admin.post("/api/projects/team/remove_members", json={"usernames": ["dev"]})
            assert r.status_code == 200, r.text
            assert await _listed(dev) == [] and await _listed(dev, project_name="team") == []


async def test_the_projects_of_a_caller_are_remembered_until_forgotten(server: RunningServer) -> None:
    async with server.client() as admin:
        assert (await admin.post("/api/projects/create", json={"project_name": "team"})).status_code == 200
        token = await _user(admin, "dev")
        r = await admin.post("/api/projects/team/add_members", json=_members(("admin", "admin"), ("dev", "user")))
        assert r.status_code == 200, r.text
    db = server.ctx.db
    dev = await accounts.authenticate(db, token)
    boss = await accounts.authenticate(db, server.token)
    team = await accounts.find_project(db, "team")
    request = Request({"type": "http", "app": SimpleNamespace(state=SimpleNamespace(ctx=server.ctx))})
    cache = AccessCache(ttl=3600.0)
    assert await cache.project_ids(request, dev, None) == [team.id]
    assert await cache.project_ids(request, dev, ["main"]) == []
    assert await cache.project_ids(request, boss, None) is None  # a global admin: every project
    await members.remove_members(db, boss, team, ["dev"])  # behind the cache's back: no forgetting
    assert await cache.project_ids(request, dev, None) == [team.id]
    cache.clear()
    assert await cache.project_ids(request, dev, None) == []
