"""The four-request escalation of a plain user to global admin (create a project, apply a local fleet, run a
task that reads the server's database, use the admin token it printed) fails where dstack refuses it: a
project made through the API has no backend, so its fleet gets no instance and the task never runs."""

from __future__ import annotations

from typing import Any

import httpx

from corral.workers.scheduling import Scheduling
from server_harness import RunningServer, fleet_body, task_body, wait_for


async def _run(c: httpx.AsyncClient, project: str, name: str) -> dict[str, Any]:
    r = await c.post(f"/api/project/{project}/runs/get", json={"run_name": name})
    assert r.status_code == 200, r.text
    return dict(r.json())


async def test_a_plain_user_cannot_run_code_on_the_server_host(server: RunningServer) -> None:
    db_file = (
        server.settings.database_url.split("///", 1)[-1] if server.settings.database_url.startswith("sqlite") else ""
    )
    async with server.client() as admin:
        r = await admin.post("/api/users/create", json={"username": "mallory", "global_role": "user"})
        assert r.status_code == 200
        token = (await admin.post("/api/users/get_user", json={"username": "mallory"})).json()["creds"]["token"]
    async with server.client(token) as c:
        # 1. dstack lets any user create a project (allow_non_admins_create_projects) -- with no backend.
        r = await c.post("/api/projects/create", json={"project_name": "mine"})
        assert r.status_code == 200 and r.json()["backends"] == []
        assert (await c.post("/api/projects/mine/get")).json()["backends"] == []
        # 2. A fleet without hosts of its own needs a backend's offers: there are none, so no instance.
        fleet = fleet_body(name="grab", nodes="1")
        plan = (await c.post("/api/project/mine/fleets/get_plan", json={"spec": fleet["plan"]["spec"]})).json()
        assert (plan["offers"], plan["total_offers"]) == ([], 0)
        assert (await c.post("/api/project/mine/fleets/apply", json=fleet)).status_code == 200
        # 3. The task that would print the server's database (and the admin token in it) never starts.
        commands = [f"cat {db_file} || true", "env", "cat /proc/self/environ"]
        task = task_body(commands, name="steal", fleets=["grab"])
        plan = (await c.post("/api/project/mine/runs/get_plan", json={"run_spec": task["plan"]["run_spec"]})).json()
        assert all(p["offers"] == [] for p in plan["job_plans"])
        assert (await c.post("/api/project/mine/runs/apply", json=task)).status_code == 200

        async def finished() -> dict[str, Any] | None:
            run = await _run(c, "mine", "steal")
            return run if run["status"] in ("failed", "terminated", "done") else None

        run = await wait_for(finished)
        job = run["jobs"][0]["job_submissions"][-1]
        assert run["status"] == "failed"
        assert job["termination_reason"] == "failed_to_start_due_to_no_capacity"
        assert job["job_provisioning_data"] is None  # never placed on any host
        logs = await c.post("/api/project/mine/logs/poll", json={"run_name": "steal", "job_submission_id": job["id"]})
        assert logs.status_code == 200 and logs.json()["logs"] == []
        await Scheduling(server.ctx).pass_once()  # a scheduling pass, run here: it provisions nothing
        assert (await c.post("/api/instances/list", json={})).json() == []
        fleets = (await c.post("/api/project/mine/fleets/list", json={})).json()
        assert [f["instances"] for f in fleets] == [[]]

        # The ways around it are refused too: main's local fleet, sharing it, joining main, making it public.
        assert (await c.post("/api/project/main/fleets/apply", json=fleet_body(name="x"))).status_code == 403
        assert (await c.post("/api/project/main/runs/apply", json=task_body(["id"]))).status_code == 403
        export = {"name": "e", "importer_projects": ["mine"], "exported_fleets": []}
        assert (await c.post("/api/project/main/exports/create", json=export)).status_code == 403
        join = {"members": [{"username": "mallory", "project_role": "user"}]}
        assert (await c.post("/api/projects/main/add_members", json=join)).status_code == 403
        assert (await c.post("/api/projects/main/update", json={"is_public": True})).status_code == 403
        # 4. Nothing of the admin's reached mallory: her lists show her alone.
        assert [u["username"] for u in (await c.post("/api/users/list")).json()] == ["mallory"]
        me = (await c.post("/api/users/get_my_user")).json()
        assert server.token not in str(me)
        r = await c.post("/api/users/get_user", json={"username": "admin"})
        assert r.status_code == 400
        assert (await c.post("/api/project/mine/fleets/delete", json={"names": ["grab"]})).status_code == 200
