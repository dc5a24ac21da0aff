"""Per-project quotas on the server: config.yml's policies (re-applied at each start for the projects that
give one), quotas/set (the body replaces the policy; bad fields named), quotas/get, quotas/usage against
a running job, scheduling/queue's order and reasons, quota.max held under 20 concurrent submitters (the
rest wait naming the quota; one run alone above it is refused), and the quota series on /metrics. Who may
call them: test_rbac_matrix.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.config.server_config import ServerConfigError, load_server_config
from corral.services.quotas import wait_reason
from server_harness import fleet_body, get_run, make_settings, running_server, task_body, wait_for

CONFIG = """
projects:
  - name: main
    weight: 3
    quota:
      nominal: {gpu: 8, cpu: 2}
      max: {gpu: {H100: 8, any: 16}, cpu: 4, memory: 1TB, price_per_hour: 40}
    preemptible_max_priority: 49
    preemptible_run_types: [task, service]
  - name: team-b
scheduling:
  preemption: {enabled: false, min_priority_gap: 10, min_runtime: 10m, grace_period: 120s}
"""

MAIN_POLICY = {
    "name": "main",
    "weight": 3,
    "quota": {
        "nominal": {"gpu": {"any": 8}, "cpu": 2},
        "max": {"gpu": {"H100": 8, "any": 16}, "cpu": 4, "memory": 1024, "price_per_hour": 40},
    },
    "preemptible_max_priority": 49,
    "preemptible_run_types": ["task", "service"],
}


async def _get(c: Any, project: str) -> dict[str, Any]:
    r = await c.post(f"/api/projects/{project}/quotas/get", json={})
    assert r.status_code == 200, r.text
    return dict(r.json())


async def test_config_policies_are_set_and_reapplied_at_each_start(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, background_processing=False)
    settings.server_dir.mkdir(parents=True)
    (settings.server_dir / "config.yml").write_text(CONFIG)
    async with running_server(settings) as s, s.client() as c:
        assert await _get(c, "main") == MAIN_POLICY
        # a project that gives no policy has none: today's behaviour
        assert await _get(c, "team-b") == {
            "name": "team-b",
            "weight": 1,
            "quota": {"nominal": {}, "max": {}},
            "preemptible_max_priority": None,
            "preemptible_run_types": None,
        }
        for project in ("main", "team-b"):
            r = await c.post(f"/api/projects/{project}/quotas/set", json={"quota": {"max": {"gpu": 2}}})
            assert r.status_code == 200, r.text
            assert r.json()["quota"] == {"nominal": {}, "max": {"gpu": {"any": 2}}}  # replaced whole
    async with running_server(settings) as s, s.client() as c:
        assert await _get(c, "main") == MAIN_POLICY  # config.yml gives main's policy: applied again
        assert (await _get(c, "team-b"))["quota"]["max"] == {"gpu": {"any": 2}}  # gives none: kept


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"quota": {"max": {"gpu": -1}}}, ["body", "quota", "max", "gpu"]),
        ({"quota": {"max": {"gpus": 4}}}, ["body", "quota", "max", "gpus"]),
        ({"quota": {"nominal": {"price_per_hour": 4}}}, ["body", "quota", "nominal", "price_per_hour"]),
        ({"weight": 0}, ["body", "weight"]),
        ({"quota": {"max": {"memory": "lots"}}}, ["body", "quota", "max", "memory"]),
        ({"preemptible_max_priority": 101}, ["body", "preemptible_max_priority"]),
        ({"preemptible_run_types": ["job"]}, ["body", "preemptible_run_types", 0]),
    ],
)
def test_bad_policies_are_refused_naming_the_field(body: dict[str, Any], field: list[str]) -> None:
    from corral.services.errors import InvalidConfiguration
    from corral.services.quotas import parse_policy_body

    with pytest.raises(InvalidConfiguration) as e:
        parse_policy_body(body)
    assert next(err["loc"][: len(field)] for err in e.value.errors) == field


def test_a_bad_config_policy_fails_the_start_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "config.yml"
    path.write_text("projects:\n  - name: main\n    quota: {max: {gpu: {H100: -2}}}\n")
    with pytest.raises(ServerConfigError, match=r"projects\.0\.quota\.max\.gpu"):
        load_server_config(path)
    path.write_text("scheduling: {preemption: {min_runtime: soon}}\n")
    with pytest.raises(ServerConfigError, match=r"scheduling\.preemption\.min_runtime"):
        load_server_config(path)


def test_wait_reasons_come_from_the_scheduler_message() -> None:
    assert wait_reason("Waiting for quota: gpu 8/8 in project x") == "quota"
    assert wait_reason("Waiting for capacity: fleet 'fl' has 2 of at most 2 instances, none free") == "capacity"
    assert (
        wait_reason("Waiting for capacity: fleet 'fl' has no free instance (the run needs 2 nodes at once)") == "gang"
    )
    assert wait_reason(None) == "capacity"


async def test_usage_and_the_queue_with_a_running_job(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        r = await c.post("/api/project/main/fleets/apply", json=fleet_body(name="fl", nodes="0..1", blocks=1))
        assert r.status_code == 200, r.text
        body = {"quota": {"nominal": {"cpu": 0}, "max": {"cpu": 64, "instances": 4}}}
        assert (await c.post("/api/projects/main/quotas/set", json=body)).status_code == 200
        for name in ("first", "second"):
            r = await c.post("/api/project/main/runs/apply", json=_named(task_body(["sleep 120"]), name))
            assert r.status_code == 200, r.text

        async def running() -> bool:
            return bool((await get_run(c, "first"))["status"] == "running")

        await wait_for(running, timeout=60)
        r = await c.post("/api/projects/main/quotas/usage", json={})
        assert r.status_code == 200, r.text
        usage = r.json()
        assert usage["used"]["instances"] == 1 and usage["used"]["cpu"] > 0
        assert usage["borrowed"]["cpu"] == usage["used"]["cpu"]  # nominal 0: all of it is borrowed
        assert usage["max"] == {"cpu": 64, "instances": 4}
        assert usage["capacity"]["instances"] == 1
        assert usage["weighted_share"] == 1.0  # the whole pool, above a nominal of 0, weight 1
        assert usage["entitlement"]["cpu"] == usage["capacity"]["cpu"]  # alone in its pool

        async def queued() -> list[dict[str, Any]]:
            entries = (await c.post("/api/scheduling/queue", json={})).json()
            return entries if entries and entries[0]["status_message"] else []

        entries = await wait_for(queued)
        assert [(e["run_name"], e["reason"], e["position"]) for e in entries] == [("second", "capacity", 0)]
        assert entries[0]["status_message"].startswith("Waiting for capacity")
        for name in ("first", "second"):
            await c.post("/api/project/main/runs/stop", json={"runs_names": [name], "abort": True})


def _named(body: dict[str, Any], name: str) -> dict[str, Any]:
    body["plan"]["run_spec"]["run_name"] = name
    return body


async def test_a_quota_holds_under_20_concurrent_submitters(tmp_path: Path) -> None:
    import asyncio

    async with running_server(make_settings(tmp_path, enable_prometheus_metrics=True)) as s, s.client() as c:
        r = await c.post("/api/project/main/fleets/apply", json=fleet_body(name="fl", nodes="0..8", blocks=1))
        assert r.status_code == 200, r.text
        body = {"quota": {"max": {"cpu": 3, "instances": 3}}}
        assert (await c.post("/api/projects/main/quotas/set", json=body)).status_code == 200
        big = await c.post(
            "/api/project/main/runs/apply", json=_named(task_body(["true"], resources={"cpu": "4.."}), "big")
        )
        assert big.status_code == 400
        assert "exceeds the quota of project main on its own: it asks for cpu 4 but quota.max allows 3" in big.text

        async def submit(i: int) -> None:
            r = await c.post("/api/project/main/runs/apply", json=_named(task_body(["sleep 120"]), f"q{i}"))
            assert r.status_code == 200, r.text

        await asyncio.gather(*(submit(i) for i in range(20)))

        async def settled() -> list[dict[str, Any]] | None:
            runs = (await c.post("/api/project/main/runs/list", json={})).json()
            running = [x for x in runs if x["status"] == "running"]
            messages = [
                (x["latest_job_submission"] or {}).get("status_message") or ""
                for x in runs
                if x["status"] == "submitted"
            ]
            done = (
                len(running) == 3 and len(messages) == 17 and all(m.startswith("Waiting for quota") for m in messages)
            )
            return runs if done else None

        runs = await wait_for(settled, timeout=60, interval=0.2)
        assert sum(x["status"] in ("provisioning", "pulling", "running") for x in runs) == 3
        usage = (await c.post("/api/projects/main/quotas/usage", json={})).json()
        assert usage["used"]["instances"] == 3 and usage["used"]["cpu"] <= 3
        waiting = await get_run(c, next(x["run_spec"]["run_name"] for x in runs if x["status"] == "submitted"))
        assert waiting["latest_job_submission"]["status_message"] == "Waiting for quota: cpu 3/3 in project main"
        queue = (await c.post("/api/scheduling/queue", json={})).json()
        assert len(queue) == 17 and {e["reason"] for e in queue} == {"quota"}
        metrics = (await c.get("/metrics")).text
        assert 'corral_project_quota_max{project="main",resource="cpu"} 3' in metrics
        assert 'corral_project_quota_used{project="main",resource="instances"} 3' in metrics
        assert 'corral_project_weighted_share{project="main"}' in metrics
        assert 'corral_project_entitlement{project="main",resource="cpu"}' in metrics
        await c.post("/api/project/main/runs/stop", json={"runs_names": [f"q{i}" for i in range(20)], "abort": True})
