"""dstack's rules beyond who reaches a route: changes to project admins, joining and leaving, what global
lists show, and the routes users/public_keys/*, users/refresh_ssh_key, projects/{p}/update and
projects/list_only_no_fleets with dstack's shapes."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx

from server_harness import RunningServer, fleet_body, task_body


async def _user(admin: httpx.AsyncClient, name: str) -> str:
    r = await admin.post("/api/users/create", json={"username": name, "global_role": "user"})
    assert r.status_code == 200, r.text
    return str((await admin.post("/api/users/get_user", json={"username": name})).json()["creds"]["token"])


def _members(*pairs: tuple[str, str]) -> dict[str, Any]:
    return {"members": [{"username": u, "project_role": r} for u, r in pairs]}


def _roles(project: dict[str, Any]) -> dict[str, str]:
    return {m["user"]["username"]: m["project_role"] for m in project["members"]}


async def test_managers_cannot_touch_admins_and_the_last_admin_stays(server: RunningServer) -> None:
    async with server.client() as admin:
        tokens = {n: await _user(admin, n) for n in ("boss", "mgr", "dev", "other")}
        await admin.post("/api/projects/create", json={"project_name": "team"})
        r = await admin.post(
            "/api/projects/team/set_members", json=_members(("boss", "admin"), ("mgr", "manager"), ("dev", "user"))
        )
        assert _roles(r.json()) == {"boss": "admin", "mgr": "manager", "dev": "user"}
    base = [("boss", "admin"), ("mgr", "manager"), ("dev", "user")]
    async with server.client(tokens["mgr"]) as mgr:
        # The escalation: a manager makes himself the only admin, then deletes the project.
        r = await mgr.post("/api/projects/team/set_members", json=_members(("mgr", "admin"), ("dev", "user")))
        assert (r.status_code, r.json()) == (403, {"msg": "Access denied: changing project admins", "code": None})
        r = await mgr.post("/api/projects/team/add_members", json=_members(("mgr", "admin")))
        assert (r.status_code, r.json()["msg"]) == (403, "Access denied: only global admins can add project admins")
        r = await mgr.post("/api/projects/team/remove_members", json={"usernames": ["boss"]})
        assert r.status_code == 403
        assert r.json()["msg"] == "Access denied: only global admins can remove project admins (user: boss)"
        r = await mgr.post("/api/projects/delete", json={"projects_names": ["team"]})
        assert (r.status_code, r.json()) == (403, {"msg": "Access denied", "code": None})
        # What a manager may do: members who are not admins, with the admins left as they are.
        r = await mgr.post("/api/projects/team/set_members", json=_members(*base, ("other", "manager")))
        assert r.status_code == 200 and _roles(r.json())["other"] == "manager"
        r = await mgr.post("/api/projects/team/remove_members", json={"usernames": ["other"]})
        assert r.status_code == 200 and "other" not in _roles(r.json())
    async with server.client(tokens["boss"]) as boss:
        # A project admin adds admins (dstack checks only managers there) but removes none.
        r = await boss.post("/api/projects/team/add_members", json=_members(("other", "admin")))
        assert r.status_code == 200 and _roles(r.json())["other"] == "admin"
        r = await boss.post("/api/projects/team/remove_members", json={"usernames": ["other"]})
        assert r.status_code == 403 and r.json()["msg"].startswith("Access denied: only global admins")
    async with server.client() as admin:
        r = await admin.post("/api/projects/team/remove_members", json={"usernames": ["boss", "other"]})
        assert (r.status_code, r.json()) == (
            400,
            {"detail": [{"msg": "Cannot remove all project admins", "code": "error"}]},
        )
        r = await admin.post("/api/projects/team/remove_members", json={"usernames": ["other"]})
        assert r.status_code == 200 and _roles(r.json()) == {"boss": "admin", "mgr": "manager", "dev": "user"}
        r = await admin.post("/api/projects/team/add_members", json=_members(("dev", "user"), ("dev", "manager")))
        assert r.status_code == 400 and r.json()["detail"][0]["msg"] == "Cannot add same user multiple times"
    async with server.client(tokens["boss"]) as boss:
        r = await boss.post("/api/projects/team/remove_members", json={"usernames": ["boss"]})
        assert r.status_code == 400
        assert r.json()["detail"][0]["msg"] == "Cannot leave project: you are the last admin"
    async with server.client(tokens["dev"]) as dev:
        r = await dev.post("/api/projects/team/remove_members", json={"usernames": ["mgr"]})
        assert r.status_code == 403 and r.json()["msg"] == "Access denied: insufficient permissions to remove members"
        r = await dev.post("/api/projects/team/remove_members", json={"usernames": ["dev"]})  # leaving is fine
        assert r.status_code == 200 and "dev" not in _roles(r.json())


async def test_public_projects_admit_non_members_only_where_dstack_does(server: RunningServer) -> None:
    async with server.client() as admin:
        guest = await _user(admin, "guest")
        await admin.post("/api/projects/create", json={"project_name": "open", "is_public": True})
        await admin.post("/api/project/open/fleets/apply", json=fleet_body(name="fl"))
        run = task_body(["echo secret-$SECRET_VALUE"], name="owned", env={"SECRET_VALUE": "hunter2"})
        assert (await admin.post("/api/project/open/runs/apply", json=run)).status_code == 200
        assert (
            await admin.post("/api/project/main/runs/apply", json=task_body(["true"], name="mm"))
        ).status_code == 200
    async with server.client(guest) as c:
        assert (await c.post("/api/projects/open/get")).status_code == 200
        assert (await c.post("/api/project/open/gateways/list", json={})).status_code == 200
        for path, body in (
            ("runs/list", {}),
            ("runs/get", {"run_name": "owned"}),
            ("runs/apply", task_body(["id"])),
            ("fleets/list", {}),
            ("repos/list", {}),
        ):
            assert (await c.post(f"/api/project/open/{path}", json=body)).status_code == 403, path
        # Global lists cover member projects only: no run of `open` (nor its env) and nothing of `main`.
        assert (await c.post("/api/runs/list", json={})).json() == []
        assert (await c.post("/api/runs/list", json={"project_name": "open"})).json() == []
        assert (await c.post("/api/fleets/list", json={})).json() == []
        assert (await c.post("/api/instances/list", json={})).json() == []
        names = {p["project_name"] for p in (await c.post("/api/projects/list", json={})).json()}
        assert names == {"open"}  # include_not_joined defaults to true
        r = await c.post("/api/projects/list", json={"include_not_joined": False})
        assert r.json() == []
        # Joining a public project: alone and as `user` only.
        r = await c.post("/api/projects/open/add_members", json=_members(("guest", "admin")))
        assert (r.status_code, r.json()["msg"]) == (403, "Access denied: can only join public projects as user role")
        r = await c.post("/api/projects/open/add_members", json=_members(("guest", "user")))
        assert r.status_code == 200 and _roles(r.json())["guest"] == "user"
        assert (await c.post("/api/project/open/runs/list", json={})).status_code == 200
        assert [x["run_spec"]["run_name"] for x in (await c.post("/api/runs/list", json={})).json()] == ["owned"]
    async with server.client() as admin:
        # runs/list's username filter names any user (dstack looks it up for every caller)
        r = await admin.post("/api/runs/list", json={"username": "nobody"})
        assert r.status_code == 400 and r.json()["detail"][0]["code"] == "resource_not_exists"
        await admin.post("/api/project/open/runs/stop", json={"runs_names": ["owned"], "abort": True})
        await admin.post("/api/project/main/runs/stop", json={"runs_names": ["mm"], "abort": True})


async def test_users_see_only_themselves_and_get_user_of_another_is_not_found(server: RunningServer) -> None:
    async with server.client() as admin:
        alice = await _user(admin, "alice")
        await _user(admin, "bob")
    async with server.client(alice) as c:
        r = await c.post("/api/users/get_user", json={"username": "bob"})
        assert (r.status_code, r.json()["detail"][0]["code"]) == (400, "resource_not_exists")
        r = await c.post("/api/users/refresh_token", json={"username": "bob"})
        assert (r.status_code, r.json()) == (403, {"detail": {"msg": "Access denied", "code": None}})


def _keygen(path: Path, comment: str) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


async def test_public_keys_and_refresh_ssh_key(server: RunningServer, tmp_path: Path) -> None:
    key = _keygen(tmp_path / "k", "laptop")
    other = _keygen(tmp_path / "o", "")
    async with server.client() as admin:
        alice = await _user(admin, "alice")
    async with server.client(alice) as c:
        assert (await c.post("/api/users/public_keys/list")).json() == []
        added = (await c.post("/api/users/public_keys/add", json={"key": key})).json()
        assert set(added) == {"id", "added_at", "name", "type", "fingerprint"}
        assert (added["name"], added["type"]) == ("laptop", "ssh-ed25519")
        fp = subprocess.run(["ssh-keygen", "-l", "-f", str(tmp_path / "k.pub")], capture_output=True, text=True)
        assert added["fingerprint"] == fp.stdout.split()[1]
        dup = await c.post("/api/users/public_keys/add", json={"key": key, "name": "again"})
        assert (dup.status_code, dup.json()["detail"][0]["code"]) == (400, "resource_exists")
        named = (await c.post("/api/users/public_keys/add", json={"key": other, "name": "ci"})).json()
        for bad, msg in (
            ("ssh-ed25519 AAAA", "Invalid public key, must be in OpenSSH public key format"),
            ("ssh-dss " + key.split()[1], "Invalid public key, must be in OpenSSH public key format"),
            ("hello", "Invalid public key, must be in OpenSSH public key format"),
        ):
            r = await c.post("/api/users/public_keys/add", json={"key": bad})
            assert (r.status_code, r.json()["detail"][0]["msg"]) == (400, msg), bad
        listed = (await c.post("/api/users/public_keys/list")).json()
        assert [k["name"] for k in listed] == ["ci", "laptop"]  # newest first
        assert (await c.post("/api/users/public_keys/delete", json={"ids": [named["id"]]})).json() is None
        assert [k["id"] for k in (await c.post("/api/users/public_keys/list")).json()] == [added["id"]]
        r = await c.post("/api/users/public_keys/delete", json={"ids": ["not-a-uuid"]})
        assert r.status_code == 422

        before = (await c.post("/api/users/get_my_user")).json()
        refreshed = (await c.post("/api/users/refresh_ssh_key", json={"username": "alice"})).json()
        assert refreshed["ssh_public_key"] != before["ssh_public_key"]
        assert refreshed["ssh_private_key"] != before["ssh_private_key"]
        # revoked at once: the next request (no cache window) and the next run carry the new key only
        now = (await c.post("/api/users/get_my_user")).json()
        assert now["ssh_public_key"] == refreshed["ssh_public_key"]
        r = await c.post("/api/users/refresh_ssh_key", json={"username": "admin"})
        assert r.status_code == 403
    async with server.client() as admin:
        # another user's keys are theirs alone
        assert (await admin.post("/api/users/public_keys/list")).json() == []
        r = await admin.post("/api/users/refresh_ssh_key", json={"username": "alice"})
        assert r.status_code == 200 and r.json()["ssh_public_key"] != refreshed["ssh_public_key"]
        r = await admin.post("/api/users/refresh_ssh_key", json={"username": "nobody"})
        assert (r.status_code, r.json()["detail"][0]["code"]) == (400, "resource_not_exists")


async def test_project_update_and_list_only_no_fleets(server: RunningServer) -> None:
    async with server.client() as admin:
        dev = await _user(admin, "dev")
        await admin.post("/api/projects/create", json={"project_name": "quiet"})
        await admin.post("/api/projects/quiet/set_members", json=_members(("admin", "admin"), ("dev", "manager")))
        names = [p["project_name"] for p in (await admin.post("/api/projects/list_only_no_fleets")).json()]
        assert names == ["main", "quiet"]  # oldest first; both have no fleet yet
        await admin.post("/api/project/main/fleets/apply", json=fleet_body(name="busy", nodes="0..1"))
        listed = (await admin.post("/api/projects/list_only_no_fleets")).json()
        assert [p["project_name"] for p in listed] == ["quiet"]
        assert listed[0]["members"] == [] and listed[0]["backends"] == []
        # a fleet exported to `quiet` counts as its fleet
        r = await admin.post(
            "/api/project/main/exports/create",
            json={"name": "share", "importer_projects": ["quiet"], "exported_fleets": ["busy"]},
        )
        assert r.status_code == 200, r.text
        assert (await admin.post("/api/projects/list_only_no_fleets")).json() == []
    async with server.client(dev) as c:
        assert (await c.post("/api/projects/list_only_no_fleets")).json() == []  # member projects only
        r = await c.post("/api/projects/quiet/update", json={"is_public": True})
        assert r.status_code == 403  # ProjectAdmin
    async with server.client() as admin:
        r = await admin.post("/api/projects/quiet/update", json={"is_public": True})
        assert r.status_code == 200 and r.json()["is_public"] is True
        assert _roles(r.json()) == {"admin": "admin", "dev": "manager"}
        r = await admin.post("/api/projects/quiet/update", json={"templates_repo": "https://example.com/t.git"})
        assert r.status_code == 400 and "not supported" in r.json()["detail"][0]["msg"]
        r = await admin.post("/api/projects/quiet/update", json={"bogus": 1})
        assert r.status_code == 422
        assert (await admin.post("/api/project/main/exports/delete", json={"name": "share"})).status_code == 200
        assert (await admin.post("/api/project/main/fleets/delete", json={"names": ["busy"]})).status_code == 200


async def test_projects_delete_follows_dstack(server: RunningServer) -> None:
    async with server.client() as admin:
        dev = await _user(admin, "dev")
        await admin.post("/api/projects/create", json={"project_name": "scratch"})
        await admin.post("/api/project/scratch/fleets/apply", json=fleet_body(name="fl"))
        r = await admin.post("/api/projects/delete", json={"projects_names": ["scratch"]})
        assert r.status_code == 400
        assert r.json()["detail"][0]["msg"] == "Failed to delete project with active fleets: ['fl']"
        r = await admin.post("/api/projects/delete", json={"projects_names": ["nope"]})
        assert r.json()["detail"][0]["msg"] == "Failed to delete non-existent projects"
    async with server.client(dev) as c:
        # a plain user is told nothing about projects that are not theirs
        for names in (["scratch"], ["nope"]):
            r = await c.post("/api/projects/delete", json={"projects_names": names})
            assert (r.status_code, r.json()) == (403, {"msg": "Access denied", "code": None})
        mine = await c.post("/api/projects/create", json={"project_name": "mine"})
        assert mine.status_code == 200 and mine.json()["backends"] == []
        assert (await c.post("/api/projects/delete", json={"projects_names": ["mine"]})).status_code == 200
        # dstack's quota: a user who is not a global admin owns at most 10 projects
        for i in range(10):
            assert (await c.post("/api/projects/create", json={"project_name": f"p{i}"})).status_code == 200
        r = await c.post("/api/projects/create", json={"project_name": "one-too-many"})
        assert (r.status_code, r.json()["detail"][0]["msg"]) == (400, "User project quota exceeded")
    async with server.client() as admin:
        await admin.post("/api/project/scratch/fleets/delete", json={"names": ["fl"]})


async def test_an_exported_fleet_is_readable_by_members_of_the_importing_project(server: RunningServer) -> None:
    """dstack's ``check_can_access_fleet``: ``fleets/get`` of another project's fleet works for a member of a
    project the fleet is exported to, and for nobody else who is not a member."""
    async with server.client() as admin:
        dev = await _user(admin, "dev")
        stranger = await _user(admin, "stranger")
        await admin.post("/api/projects/create", json={"project_name": "consumer"})
        await admin.post("/api/projects/consumer/add_members", json=_members(("dev", "user")))
        await admin.post("/api/project/main/fleets/apply", json=fleet_body(name="shared", nodes="0..1"))
        await admin.post("/api/project/main/fleets/apply", json=fleet_body(name="private", nodes="0..1"))
        body = {"name": "share", "importer_projects": ["consumer"], "exported_fleets": ["shared"]}
        assert (await admin.post("/api/project/main/exports/create", json=body)).status_code == 200
    async with server.client(dev) as c:
        r = await c.post("/api/project/main/fleets/get", json={"name": "shared"})
        assert r.status_code == 200 and r.json()["name"] == "shared"
        for name in ("private", "nope"):
            r = await c.post("/api/project/main/fleets/get", json={"name": name})
            assert (r.status_code, r.json()) == (403, {"detail": {"msg": "Access denied", "code": None}})
        assert (await c.post("/api/project/main/fleets/list", json={})).status_code == 403
        assert (await c.post("/api/project/nope/fleets/get", json={"name": "shared"})).status_code == 404
    async with server.client(stranger) as c:
        assert (await c.post("/api/project/main/fleets/get", json={"name": "shared"})).status_code == 403
    async with server.client() as admin:
        await admin.post("/api/project/main/exports/delete", json={"name": "share"})
        await admin.post("/api/project/main/fleets/delete", json={"names": ["shared", "private"]})
