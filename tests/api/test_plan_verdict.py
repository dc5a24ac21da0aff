"""``runs/get_plan`` carries the scheduler's verdict: a run that ``apply`` would fail at once gets no offers
(the official CLI then warns) and the reason in ``corral_plan_error`` -- the very message the submitted run
fails with; and a fleet whose ``backends`` this server lacks is refused at plan time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from server_harness import fleet_body, make_settings, running_server, task_body, wait_for


async def _plan(c: httpx.AsyncClient, body: dict[str, Any], **extra: Any) -> dict[str, Any]:
    r = await c.post("/api/project/main/runs/get_plan", json={"run_spec": body["plan"]["run_spec"], **extra})
    assert r.status_code == 200, r.text
    return dict(r.json())


async def _fails_with(c: httpx.AsyncClient, body: dict[str, Any]) -> str:
    name = (await c.post("/api/project/main/runs/apply", json=body)).json()["run_spec"]["run_name"]

    async def failed() -> str | None:
        run = (await c.post("/api/project/main/runs/get", json={"run_name": name})).json()
        return run["latest_job_submission"]["termination_reason_message"] if run["status"] == "failed" else None

    return str(await wait_for(failed))


async def test_the_plan_says_what_apply_would_refuse(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        # no fleet at all: no offers in the plan, yet `corral offer` (for_offers_only) still lists the backend's
        lonely = task_body(["true"], name="lonely")
        plan = await _plan(c, lonely)
        assert plan["corral_plan_error"] and [p["offers"] for p in plan["job_plans"]] == [[]]
        assert plan["job_plans"][0]["total_offers"] == 0
        assert (await _plan(c, lonely, for_offers_only=True))["job_plans"][0]["offers"]
        assert await _fails_with(c, lonely) == plan["corral_plan_error"]

        await c.post("/api/project/main/fleets/apply", json=fleet_body(name="fl"))
        fine = await _plan(c, task_body(["true"]))
        assert fine["corral_plan_error"] is None and fine["job_plans"][0]["offers"]
        cases: dict[str, tuple[dict[str, Any], str]] = {
            "unknown-fleet": ({"fleets": ["does-not-exist"]}, "no fleet named 'does-not-exist'"),
            "two-nodes": ({"nodes": 2}, "placement: cluster"),
            "many-gpus": ({"resources": {"cpu": "1..", "memory": "0.1GB..", "gpu": 8}}, "gpu"),
        }
        for name, (extra, needle) in cases.items():
            body = task_body(["true"], name=name, **extra)
            plan = await _plan(c, body)
            error = plan["corral_plan_error"]
            assert error and needle in error, (name, error)
            assert all(p["offers"] == [] for p in plan["job_plans"]), name
            assert await _fails_with(c, body) == error, name


async def test_a_fleet_on_backends_the_server_lacks_is_refused_at_plan_time(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        conf = fleet_body(name="cloudy", backends=["aws"])["plan"]["spec"]
        r = await c.post("/api/project/main/fleets/get_plan", json={"spec": conf})
        assert r.status_code == 400, r.text
        msg = r.json()["detail"][0]["msg"]
        assert "`backends` (aws) is not configured for project main" in msg and "`remote` (this machine)" in msg, msg
        applied = await c.post("/api/project/main/fleets/apply", json=fleet_body(name="cloudy", backends=["aws"]))
        assert applied.status_code == 400
        assert (await c.post("/api/project/main/fleets/list", json={})).json() == []
        ok = await c.post(
            "/api/project/main/fleets/get_plan", json={"spec": fleet_body(backends=["remote"])["plan"]["spec"]}
        )
        assert ok.status_code == 200 and ok.json()["offers"]


async def test_deleting_an_active_run_says_so_plainly(tmp_path: Path) -> None:
    # no workers: the run stays submitted (active)
    async with running_server(make_settings(tmp_path, background_processing=False)) as s, s.client() as c:
        await c.post("/api/project/main/runs/apply", json=task_body(["true"], name="busy"))
        r = await c.post("/api/project/main/runs/delete", json={"runs_names": ["busy"]})
        assert r.status_code == 400
        assert r.json()["detail"][0]["msg"] == "Cannot delete active run busy: stop it first"


async def test_a_fleet_exported_to_the_project_counts_in_the_verdict(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path, background_processing=False)) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(name="fl"))
        await c.post("/api/projects/create", json={"project_name": "team-b"})
        body = {"run_spec": task_body(["true"], fleets=["main/fl"])["plan"]["run_spec"]}
        before = (await c.post("/api/project/team-b/runs/get_plan", json=body)).json()
        assert "no fleet named 'main/fl' in project 'team-b'" in before["corral_plan_error"]
        r = await c.post(
            "/api/project/main/exports/create",
            json={"name": "share", "importer_projects": ["team-b"], "exported_fleets": ["fl"]},
        )
        assert r.status_code == 200, r.text
        after = (await c.post("/api/project/team-b/runs/get_plan", json=body)).json()
        assert after["corral_plan_error"] is None
