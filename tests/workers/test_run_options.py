"""Run options corral accepts in dstack's grammar but does not apply are refused with a 400 naming the
field (and the plan says so first); ``home_dir`` and a run's ``backends`` are applied."""

from __future__ import annotations

from pathlib import Path

from corral.scheduler.schedule import run_backends
from corral.services.job_specs import job_specs
from server_harness import fleet_body, make_settings, running_server, task_body


def test_a_run_s_backends_in_corral_s_names() -> None:
    assert run_backends(["remote"]) == {"local", "ssh"}
    assert run_backends(["aws", "gcp"]) == {"aws", "gcp"}


def test_home_dir_reaches_the_job_spec() -> None:
    spec = {"configuration": {"type": "task", "commands": ["true"], "home_dir": "/home/me"}, "repo_data": {},
            "repo_code_hash": None}  # fmt: skip

    class Merged:
        max_duration = stop_duration = max_price = spot_policy = reservation = retry = None

    assert job_specs("r", spec, None, Merged())[0]["home_dir"] == "/home/me"


async def test_refused_run_options_name_the_field(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        cases = [
            ({"utilization_policy": {"min_gpu_utilization": 10, "time_window": "10m"}}, "job metrics"),
            ({"schedule": {"cron": "0 0 31 2 *"}}, "never fire"),
            ({"regions": ["us-east-1"]}, "`regions`"),
            ({"spot_policy": "spot"}, "spot"),
            ({"nodes": 2, "startup_order": "master-first"}, "startup_order"),
            ({"nodes": 2, "stop_criteria": "master-done"}, "stop_criteria"),
        ]
        for extra, words in cases:
            r = await c.post("/api/project/main/runs/apply", json=task_body(["true"], **extra))
            assert r.status_code == 400, (extra, r.text)
            assert words in r.json()["detail"][0]["msg"], (extra, r.text)
        # node groups' address references must name a node the run has
        groups = {"groups": [{"name": "a", "commands": ["echo ${{ groups[1].nodes[0].IP_ADDRESS }}"]}]}
        body = task_body([], **groups)
        del body["plan"]["run_spec"]["configuration"]["commands"]
        r = await c.post("/api/project/main/runs/apply", json=body)
        assert r.status_code == 400 and "groups[1].nodes[0]" in r.text and "out of range" in r.text, r.text
        # a run's `backends` keeps it off the others' instances and offers
        assert (await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..1"))).is_success
        for backends, verdict in ((["aws"], "does not list its backends (remote)"), (["remote"], None)):
            spec = task_body(["true"], backends=backends, fleets=["fl"])["plan"]["run_spec"]
            plan = (await c.post("/api/project/main/runs/get_plan", json={"run_spec": spec})).json()
            assert (plan["corral_plan_error"] is None) == (verdict is None), plan["corral_plan_error"]
            assert verdict is None or verdict in plan["corral_plan_error"]
            assert bool(plan["job_plans"][0]["offers"]) == (verdict is None)
        # the plan says it too, before apply
        plan = await c.post(
            "/api/project/main/runs/get_plan", json={"run_spec": task_body(["true"], regions=["x"])["plan"]["run_spec"]}
        )
        assert plan.status_code == 200 and "`regions`" in plan.json()["corral_plan_error"], plan.text
