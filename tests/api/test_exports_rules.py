"""Exports as dstack 0.22.5 rules them (``routers/exports.py``, ``services/exports.py``): only an admin of the
exporting project (or a global admin) creates or changes an export, a project becomes an importer only by an
admin of that project, only global admins make an export global; the importing project's members then see
the fleet's offers in their plan and may run on it, other projects' members may not. And the local backend
without a sandbox admits no run of a user who is not a global admin, whether it reaches it through the
project's own backends or through a local fleet exported to the project."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from server_harness import RunningServer, fleet_body, make_settings, running_server, task_body, wait_for
from skip_policy import needs_root


async def _user(admin: httpx.AsyncClient, name: str, **roles: str) -> str:
    """A user of global role ``user`` with ``roles`` (project -> role); returns the token."""
    r = await admin.post("/api/users/create", json={"username": name, "global_role": "user"})
    assert r.status_code == 200, r.text
    for project, role in roles.items():
        body = {"members": [{"username": name, "project_role": role}]}
        assert (await admin.post(f"/api/projects/{project}/add_members", json=body)).status_code == 200
    return str((await admin.post("/api/users/get_user", json={"username": name})).json()["creds"]["token"])


async def _plan(c: httpx.AsyncClient, project: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await c.post(f"/api/project/{project}/runs/get_plan", json={"run_spec": body["plan"]["run_spec"]})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _msg(r: httpx.Response) -> str:
    body = r.json()
    return str(body["msg"] if "msg" in body else body["detail"][0]["msg"] if isinstance(body["detail"], list) else "")


async def _setup(s: RunningServer) -> dict[str, str]:
    async with s.client() as admin:
        for p in ("team-b", "team-c"):
            assert (await admin.post("/api/projects/create", json={"project_name": p})).status_code == 200
        assert (await admin.post("/api/project/main/fleets/apply", json=fleet_body(name="fl"))).status_code == 200
        return {
            "boss": await _user(admin, "boss", main="admin"),
            "mgr": await _user(admin, "mgr", main="manager"),
            "dev": await _user(admin, "dev", main="user"),
            "carol": await _user(admin, "carol", **{"team-b": "user"}),
            "dave": await _user(admin, "dave", **{"team-c": "user"}),
        }


async def test_only_admins_export_and_only_the_importers_members_use_it(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path, background_processing=False)) as s:
        tokens = await _setup(s)
        share = {"name": "share", "importer_projects": ["team-b"], "exported_fleets": ["fl"]}
        for name in ("dev", "mgr", "carol"):
            async with s.client(tokens[name]) as c:
                r = await c.post("/api/project/main/exports/create", json=share)
                assert r.status_code == 403, (name, r.text)
        async with s.client(tokens["boss"]) as boss:
            # an admin of main who is no admin of team-b cannot make team-b import (dstack's message)
            r = await boss.post("/api/project/main/exports/create", json=share)
            assert r.status_code == 400 and _msg(r) == (
                "Projects {'team-b'} not found or you are not allowed to add them as importers."
                " Only project admins can add a project as importer"
            ), r.text
            r = await boss.post("/api/project/main/exports/create", json={"name": "all", "is_global": True})
            assert (r.status_code, _msg(r)) == (403, "Only global admins can make the export global")
            r = await boss.post("/api/project/main/exports/create", json={**share, "importer_projects": ["main"]})
            assert r.status_code == 400 and "cannot import from itself" in _msg(r)
            assert (await boss.post("/api/project/main/exports/list")).json() == []
        async with s.client() as admin:
            body = {"members": [{"username": "boss", "project_role": "admin"}]}
            assert (await admin.post("/api/projects/team-b/add_members", json=body)).status_code == 200
        async with s.client(tokens["boss"]) as boss:
            r = await boss.post("/api/project/main/exports/create", json=share)
            assert r.status_code == 200, r.text
            assert [i["project_name"] for i in r.json()["imports"]] == ["team-b"]
            update = {"name": "share", "add_importer_projects": ["team-c"]}
            r = await boss.post("/api/project/main/exports/update", json=update)
            assert r.status_code == 400 and "not allowed to add them as importers" in _msg(r)
            r = await boss.post("/api/project/main/exports/update", json={"name": "share"})
            assert (r.status_code, _msg(r)) == (400, "No changes specified")
            r = await boss.post("/api/project/main/exports/update", json={"name": "share", "set_global": True})
            assert (r.status_code, _msg(r)) == (403, "Only global admins can make the export global")
            r = await boss.post(
                "/api/project/main/exports/update", json={"name": "share", "add_importer_projects": ["team-b"]}
            )
            assert r.status_code == 400 and "already importing" in _msg(r)
        for name in ("dev", "mgr"):
            async with s.client(tokens[name]) as c:
                r = await c.post("/api/project/main/exports/update", json=update)
                assert r.status_code == 403, (name, r.text)
                r = await c.post("/api/project/main/exports/delete", json={"name": "share"})
                assert r.status_code == 403, (name, r.text)
        async with s.client() as admin:
            exported = (await admin.post("/api/project/main/exports/list")).json()
            assert [(e["name"], [i["project_name"] for i in e["imports"]], e["is_global"]) for e in exported] == [
                ("share", ["team-b"], False)
            ]


async def test_the_plan_shows_an_imported_fleets_offers(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path, background_processing=False)) as s:
        tokens = await _setup(s)
        async with s.client() as admin:
            share = {"name": "share", "importer_projects": ["team-b"], "exported_fleets": ["fl"]}
            assert (await admin.post("/api/project/main/exports/create", json=share)).status_code == 200
        # team-b (no backends of its own) sees main/f's offers and no error, with or without naming it;
        # team-c, which does not import it, sees neither and its run would fail at once (in containers: the
        # local backend without a sandbox admits only global admins' host processes)
        task = task_body(["true"], name="tt", fleets=["main/fl"], image="alpine")
        async with s.client(tokens["carol"]) as carol:
            for body in (task, task_body(["true"], name="tt", image="alpine")):
                plan = await _plan(carol, "team-b", body)
                assert plan["corral_plan_error"] is None, plan["corral_plan_error"]
                offers = plan["job_plans"][0]["offers"]
                assert offers and {o["backend"] for o in offers} == {"remote"}, offers
                assert plan["job_plans"][0]["total_offers"] == len(offers)
        async with s.client(tokens["dave"]) as dave:
            plan = await _plan(dave, "team-c", task)
            assert "no fleet named 'main/fl'" in plan["corral_plan_error"]
            assert plan["job_plans"][0]["offers"] == []
            assert (await dave.post("/api/project/main/fleets/get", json={"name": "fl"})).status_code == 403
        async with s.client() as admin:  # a global export reaches every other project, team-c included
            r = await admin.post(
                "/api/project/main/exports/create", json={"name": "all", "is_global": True, "exported_fleets": ["fl"]}
            )
            assert r.status_code == 200, r.text
        async with s.client(tokens["dave"]) as dave:
            plan = await _plan(dave, "team-c", task)
            assert plan["corral_plan_error"] is None, plan["corral_plan_error"]
            assert {o["backend"] for o in plan["job_plans"][0]["offers"]} == {"remote"}


async def test_without_a_sandbox_an_exported_local_fleet_admits_only_global_admins(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path, sandbox="off", background_processing=False)) as s:
        tokens = await _setup(s)
        async with s.client() as admin:
            share = {"name": "share", "importer_projects": ["team-b"], "exported_fleets": ["fl"]}
            assert (await admin.post("/api/project/main/exports/create", json=share)).status_code == 200
            for body in (task_body(["true"], name="admins"), task_body(["true"], name="named", fleets=["main/fl"])):
                r = await admin.post("/api/project/team-b/runs/apply", json=body)
                assert r.status_code == 200, r.text
        async with s.client(tokens["carol"]) as carol:
            for body in (task_body(["id"], name="mine"), task_body(["id"], name="named2", fleets=["main/fl"])):
                plan = await _plan(carol, "team-b", body)
                assert "without a sandbox" in (plan["corral_plan_error"] or ""), plan["corral_plan_error"]
                assert plan["job_plans"][0]["offers"] == []
                r = await carol.post("/api/project/team-b/runs/apply", json=body)
                assert r.status_code == 400 and "without a sandbox" in _msg(r), r.text
                assert _msg(r) == plan["corral_plan_error"]
            # in a container the job is no host process: admitted
            r = await carol.post("/api/project/team-b/runs/apply", json=task_body(["id"], name="boxed", image="alpine"))
            assert r.status_code == 200, r.text
            names = [x["run_spec"]["run_name"] for x in (await carol.post("/api/runs/list", json={})).json()]
            assert sorted(names) == ["admins", "boxed", "named"]
        async with s.client(tokens["dave"]) as dave:
            # a project that imports nothing is not refused for the local backend: its run has no fleet at all
            r = await dave.post("/api/project/team-c/runs/apply", json=task_body(["id"], name="nothing"))
            assert r.status_code == 200, r.text


async def test_without_a_sandbox_a_queued_run_never_lands_on_a_local_fleet_exported_later(tmp_path: Path) -> None:
    # admitted at apply (nothing reached the local backend then), then main/f is exported to its project:
    # the scheduler holds the same rule, so the plain user's host process never runs on the server's host
    async with running_server(make_settings(tmp_path, sandbox="off", background_processing=False)) as s:
        tokens = await _setup(s)
        async with s.client(tokens["dave"]) as dave:
            r = await dave.post("/api/project/team-c/runs/apply", json=task_body(["id"], name="sneak"))
            assert r.status_code == 200, r.text
        async with s.client() as admin:
            r = await admin.post("/api/project/team-c/runs/apply", json=task_body(["id"], name="admins"))
            assert r.status_code == 200, r.text
            share = {"name": "share", "importer_projects": ["team-c"], "exported_fleets": ["fl"]}
            assert (await admin.post("/api/project/main/exports/create", json=share)).status_code == 200
        from corral.workers.scheduling import Scheduling

        result = await Scheduling(s.ctx).pass_once()
        async with s.client() as admin:
            runs = {
                r["run_spec"]["run_name"]: r["latest_job_submission"]
                for r in (await admin.post("/api/project/team-c/runs/list", json={})).json()
            }
        assert len(result.assigned) == 1, result
        assert runs["admins"]["status"] in ("provisioning", "pulling", "running", "done"), runs["admins"]
        assert runs["sneak"]["job_provisioning_data"] is None, runs["sneak"]
        assert runs["sneak"]["status"] == "failed", runs["sneak"]
        assert "run jobs without a sandbox on this server" in runs["sneak"]["termination_reason_message"]


@needs_root("the sandbox needs root (CI runs as root)")
async def test_a_member_of_the_importing_project_runs_on_the_exported_fleet(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path, sandbox="on")) as s:
        tokens = await _setup(s)
        async with s.client() as admin:
            share = {"name": "share", "importer_projects": ["team-b"], "exported_fleets": ["fl"]}
            assert (await admin.post("/api/project/main/exports/create", json=share)).status_code == 200
        async with s.client(tokens["carol"]) as carol:
            r = await carol.post("/api/project/team-b/runs/apply", json=task_body(["echo hi"], name="shared"))
            assert r.status_code == 200, r.text

            async def finished() -> dict[str, Any] | None:
                run = (await carol.post("/api/project/team-b/runs/get", json={"run_name": "shared"})).json()
                return dict(run) if run["status"] in ("done", "failed", "terminated") else None

            run = await wait_for(finished, timeout=60)
            assert run["status"] == "done", run["latest_job_submission"]
            assert run["latest_job_submission"]["job_provisioning_data"]["backend"] == "remote"
            # the instance it ran on, idle now, is among the plan's offers too
            plan = await _plan(carol, "team-b", task_body(["true"], name="again"))
            assert plan["corral_plan_error"] is None
            assert "idle" in [o["availability"] for o in plan["job_plans"][0]["offers"]], plan["job_plans"][0]
        async with s.client(tokens["dave"]) as dave:
            r = await dave.post(
                "/api/project/team-c/runs/apply", json=task_body(["true"], name="tt", fleets=["main/fl"])
            )
            assert r.status_code == 200

            async def failed() -> dict[str, Any] | None:
                run = (await dave.post("/api/project/team-c/runs/get", json={"run_name": "tt"})).json()
                return dict(run) if run["status"] == "failed" else None

            run = await wait_for(failed, timeout=30)
            assert "no fleet named 'main/fl'" in run["latest_job_submission"]["termination_reason_message"]
