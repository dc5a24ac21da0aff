"""The `instances` option: every selector form, allow-list semantics, waiting on a busy instance, up-front
validation, and cross-project references through exports."""

from __future__ import annotations

from typing import Any

import httpx

from corral.workers.scheduling import Scheduling
from server_harness import RunningServer, finished_run, fleet_body, get_run, task_body, wait_for


async def _two_idle(c: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes={"min": 2, "max": 3}))

    async def ready() -> dict[str, dict[str, Any]] | None:
        insts = (await c.post("/api/instances/list", json={})).json()
        idle = {i["name"]: i for i in insts if i["status"] == "idle"}
        return idle if len(idle) == 2 else None

    return dict(await wait_for(ready))


def _instance_of(run: dict[str, Any]) -> str:
    return str(run["latest_job_submission"]["job_provisioning_data"]["instance_id"])


async def test_every_selector_form_places_on_the_selected_instance(server: RunningServer) -> None:
    async with server.client() as c:
        idle = await _two_idle(c)
        f0, f1 = idle["fl-0"], idle["fl-1"]
        cases = {
            "by-short-name": (["fl-1"], f1),
            "by-name": ([{"name": "fl-0"}], f0),
            "by-fleet-num": ([{"fleet": "fl", "instance": 1}], f1),
            "by-fleet-object": ([{"fleet": {"name": "fl"}, "instance": 0}], f0),
            "by-qualified-fleet": ([{"fleet": "main/fl", "instance": 1}], f1),
        }
        for name, (selectors, _) in cases.items():
            await c.post("/api/project/main/runs/apply", json=task_body(["true"], name=name, instances=selectors))
            got = await finished_run(c, name)
            assert got["status"] == "done", (name, got["latest_job_submission"])
            assert _instance_of(got) == cases[name][1]["id"], name
        # Hostname (case-insensitive) and the internal IP match an instance too.
        host = f0["hostname"].upper()
        await c.post(
            "/api/project/main/runs/apply", json=task_body(["true"], name="by-host", instances=[{"hostname": host}])
        )
        assert (await finished_run(c, "by-host"))["status"] == "done"
        await c.post(
            "/api/project/main/runs/apply",
            json=task_body(["true"], name="by-ip", instances=[{"hostname": "127.0.0.1"}]),
        )
        assert (await finished_run(c, "by-ip"))["status"] == "done"
        insts = (await c.post("/api/instances/list", json={})).json()
        assert len(insts) == 2  # nothing new was ever reserved


async def test_selector_matching_nothing_fails_at_once_and_provisions_nothing(server: RunningServer) -> None:
    async with server.client() as c:
        await _two_idle(c)
        body = task_body(["true"], name="nope", instances=[{"name": "fl-9"}, "fl-0"])
        await c.post("/api/project/main/runs/apply", json=body)
        got = await finished_run(c, "nope")
        sub = got["latest_job_submission"]
        assert sub["termination_reason"] == "failed_to_start_due_to_no_capacity"
        assert sub["termination_reason_message"].startswith("Failed to use specified instances")
        assert "fl-9" in sub["termination_reason_message"]
        assert len((await c.post("/api/instances/list", json={})).json()) == 2


async def test_busy_selected_instance_makes_the_job_wait_then_run(server: RunningServer) -> None:
    async with server.client() as c:
        await _two_idle(c)
        await c.post("/api/project/main/runs/apply", json=task_body(["sleep 600"], name="holder", instances=["fl-0"]))

        async def running() -> bool:
            return bool((await get_run(c, "holder"))["status"] == "running")

        await wait_for(running)
        await c.post("/api/project/main/runs/apply", json=task_body(["true"], name="pinned", instances=["fl-0"]))
        await c.post("/api/project/main/runs/apply", json=task_body(["true"], name="existing-only", instances=[]))
        assert (await finished_run(c, "existing-only"))["status"] == "done"  # took the idle fl-1
        result = await Scheduling(server.ctx).pass_once()  # a scheduling pass, run here: the job waits
        assert not result.assigned and not result.reserved and not result.failed
        assert (await get_run(c, "pinned"))["status"] == "submitted"
        assert len((await c.post("/api/instances/list", json={})).json()) == 2  # nothing provisioned for it
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["holder"], "abort": False})
        got = await finished_run(c, "pinned")
        assert got["status"] == "done"
        assert len((await c.post("/api/instances/list", json={})).json()) == 2


async def test_plan_and_apply_reject_too_few_instances_for_nodes(server: RunningServer) -> None:
    async with server.client() as c:
        conf = {"type": "task", "nodes": 3, "commands": ["true"], "instances": ["a", "b"]}
        r = await c.post("/api/project/main/runs/get_plan", json={"run_spec": {"configuration": conf}})
        assert r.status_code == 400
        assert r.json()["detail"][0]["msg"] == "`instances` specifies 2 instance(s) but the run requires 3 nodes"
        r = await c.post(
            "/api/project/main/runs/apply", json={"force": False, "plan": {"run_spec": {"configuration": conf}}}
        )
        assert r.status_code == 400
        single = {"type": "task", "commands": ["true"], "instances": ["a"], "resources": {"cpu": "1.."}}
        plan = (await c.post("/api/project/main/runs/get_plan", json={"run_spec": {"configuration": single}})).json()
        assert plan["job_plans"][0]["offers"] == []  # no new-capacity offers for a pinned run
        bad = {"type": "task", "commands": ["true"], "instances": [{"fleet": "fl", "instance": -1}]}
        r = await c.post("/api/project/main/runs/get_plan", json={"run_spec": {"configuration": bad}})
        assert r.status_code == 422 and "instances" in r.json()["detail"][0]["loc"]


async def test_cross_project_reference_needs_an_export(server: RunningServer) -> None:
    async with server.client() as c:
        idle = await _two_idle(c)
        await c.post("/api/projects/create", json={"project_name": "team-b"})
        pinned = task_body(["true"], name="cross", instances=[{"fleet": "main/fl", "instance": 0}])
        await c.post("/api/project/team-b/runs/apply", json=pinned)
        got = await finished_run(c, "cross", "team-b")
        assert got["latest_job_submission"]["termination_reason_message"].startswith(
            "Failed to use specified instances"
        )
        r = await c.post(
            "/api/project/main/exports/create",
            json={"name": "share", "importer_projects": ["team-b"], "exported_fleets": ["fl"]},
        )
        assert r.status_code == 200, r.text
        assert r.json()["imports"][0]["project_name"] == "team-b"
        imports = (await c.post("/api/project/team-b/imports/list")).json()
        assert imports[0]["export"]["exported_fleets"][0]["name"] == "fl"
        listed = (await c.post("/api/project/team-b/fleets/list", json={"include_imported": True})).json()
        assert [f["name"] for f in listed] == ["fl"]
        await c.post("/api/project/team-b/runs/apply", json={**pinned, "force": True})
        got = await finished_run(c, "cross", "team-b")
        assert got["status"] == "done", got["latest_job_submission"]
        assert _instance_of(got) == idle["fl-0"]["id"]
        # Removing the import takes the fleet away again.
        r = await c.post(
            "/api/project/team-b/imports/delete", json={"export_name": "share", "export_project_name": "main"}
        )
        assert r.status_code == 200
        assert (await c.post("/api/project/main/exports/list")).json()[0]["imports"] == []
        assert (await c.post("/api/project/main/exports/delete", json={"name": "share"})).status_code == 200
