"""``include_imported`` on the global lists, as dstack 0.22.5 reads it (``list_projects_fleet_models`` in
``server/services/fleets.py``, ``list_projects_instance_models`` in ``server/services/instances.py``):
``/api/fleets/list`` and ``/api/instances/list`` add the fleets exported to the projects the caller is a member of,
and their instances; a caller who is no member of an importing project sees none of them. ``/api/volumes/list``
takes no such field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from server_harness import RunningServer, fleet_body, make_settings, running_server, wait_for


async def _user(admin: httpx.AsyncClient, name: str, project: str) -> str:
    """A user of global role ``user``, a member (``user``) of ``project``; returns the token."""
    r = await admin.post("/api/users/create", json={"username": name, "global_role": "user"})
    assert r.status_code == 200, r.text
    body = {"members": [{"username": name, "project_role": "user"}]}
    assert (await admin.post(f"/api/projects/{project}/add_members", json=body)).status_code == 200
    return str((await admin.post("/api/users/get_user", json={"username": name})).json()["creds"]["token"])


async def _names(c: httpx.AsyncClient, route: str, **body: Any) -> list[tuple[str, str]]:
    r = await c.post(route, json=body)
    assert r.status_code == 200, r.text
    key = "fleet_name" if "instances" in route else "name"
    return [(str(x["project_name"]), str(x[key])) for x in r.json()]


async def _shared(s: RunningServer, admin: httpx.AsyncClient) -> tuple[str, str]:
    """Fleet ``fl`` of ``main`` (one instance) exported to ``team-b``, ``kept`` not exported; carol of ``team-b``,
    dave of ``team-c``: their tokens."""
    for p in ("team-b", "team-c"):
        assert (await admin.post("/api/projects/create", json={"project_name": p})).status_code == 200
    r = await admin.post("/api/project/main/fleets/apply", json=fleet_body(name="fl", nodes="1..1"))
    assert r.status_code == 200, r.text
    assert (await admin.post("/api/project/main/fleets/apply", json=fleet_body(name="kept"))).status_code == 200
    await wait_for(lambda: _names(admin, "/api/instances/list"))  # fl's nodes.min instance
    carol, dave = await _user(admin, "carol", "team-b"), await _user(admin, "dave", "team-c")
    share = {"name": "share", "importer_projects": ["team-b"], "exported_fleets": ["fl"]}
    assert (await admin.post("/api/project/main/exports/create", json=share)).status_code == 200
    return carol, dave


async def test_fleets_list_adds_the_fleets_exported_to_the_callers_projects(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path)) as s, s.client() as admin:
        carol, dave = await _shared(s, admin)
        async with s.client(carol) as c:
            assert await _names(c, "/api/fleets/list") == []
            assert await _names(c, "/api/fleets/list", include_imported=True) == [("main", "fl")]
            assert await _names(c, "/api/fleets/list", include_imported=True, project_name="team-b") == [("main", "fl")]
            assert await _names(c, "/api/fleets/list", include_imported=True, project_name="main") == []
            (fl,) = (await c.post("/api/fleets/list", json={"include_imported": True})).json()
            assert len(fl["instances"]) == 1  # its instance, as the owner's list shows it
        async with s.client(dave) as c:  # a member of no importing project
            assert await _names(c, "/api/fleets/list", include_imported=True) == []
        # a global export is imported by every project
        body = {"name": "all", "is_global": True, "exported_fleets": ["kept"]}
        assert (await admin.post("/api/project/main/exports/create", json=body)).status_code == 200
        async with s.client(dave) as c:
            assert await _names(c, "/api/fleets/list", include_imported=True) == [("main", "kept")]
        # a global admin's list holds every project's fleets already
        listed = sorted(await _names(admin, "/api/fleets/list", include_imported=True))
        assert listed == [("main", "fl"), ("main", "kept")]


async def test_instances_list_adds_the_instances_of_fleets_exported_to_the_callers_projects(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path)) as s, s.client() as admin:
        carol, dave = await _shared(s, admin)
        async with s.client(carol) as c:
            assert await _names(c, "/api/instances/list") == []
            assert await _names(c, "/api/instances/list", include_imported=True) == [("main", "fl")]
            assert await _names(c, "/api/instances/list", include_imported=True, project_names=["team-c"]) == []
            # dstack's volumes/list has no include_imported, and refuses a field it does not know
            r = await c.post("/api/volumes/list", json={"include_imported": True})
            assert r.status_code == 422 and "include_imported" in r.text, r.text
        async with s.client(dave) as c:  # a member of no importing project
            assert await _names(c, "/api/instances/list", include_imported=True) == []
