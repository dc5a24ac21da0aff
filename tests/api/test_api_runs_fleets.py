"""Fleets and runs over HTTP: plans, apply semantics, the seed body, errors, a task on the local backend."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx

from server_harness import (
    SEED_BODY,
    SEED_FLEET,
    RunningServer,
    fleet_body,
    make_settings,
    running_server,
    task_body,
    wait_for,
)


async def _run(c: httpx.AsyncClient, name: str) -> dict[str, Any]:
    r = await c.post("/api/project/main/runs/get", json={"run_name": name})
    assert r.status_code == 200, r.text
    return dict(r.json())


async def _logs(c: httpx.AsyncClient, run: dict[str, Any]) -> bytes:
    sub = run["latest_job_submission"]["id"]
    r = await c.post(
        "/api/project/main/logs/poll",
        json={"run_name": run["run_spec"]["run_name"], "job_submission_id": sub, "limit": 1000},
    )
    return b"".join(base64.b64decode(x["message"]) for x in r.json()["logs"])


async def test_a_fleets_resources_narrow_the_offers_it_may_have(server: RunningServer) -> None:
    async def offers(resources: dict[str, Any]) -> int:
        conf = {**SEED_FLEET, "name": "narrow", "resources": resources}
        r = await c.post("/api/project/main/fleets/get_plan", json={"spec": {"configuration": conf, "profile": {}}})
        assert r.status_code == 200, r.text
        total: int = r.json()["total_offers"]
        return total

    async with server.client() as c:
        assert await offers({"cpu": "1..", "memory": "0.1GB.."}) == 1
        assert await offers({"cpu": "1000.."}) == 0
        assert await offers({"cpu": "1..", "memory": "100000GB.."}) == 0
        assert await offers({"cpu": "1..", "disk": "100000000GB.."}) == 0
        assert await offers({"cpu": "1..", "gpu": 1}) == 0  # this machine has no GPU


async def test_fleet_plan_apply_get_list_delete(server: RunningServer) -> None:
    async with server.client() as c:
        plan = (
            await c.post(
                "/api/project/main/fleets/get_plan",
                json={"spec": {"configuration": SEED_FLEET, "profile": {}}},
            )
        ).json()
        assert plan["action"] == "create"
        assert plan["spec"]["configuration"]["nodes"] == {"min": 0, "max": 3}
        assert plan["total_offers"] == 1 and plan["offers"][0]["backend"] == "remote"
        body = {"force": False, "plan": {"spec": {"configuration": SEED_FLEET, "profile": {}}}}
        fleet = (await c.post("/api/project/main/fleets/apply", json=body)).json()
        assert fleet["status"] == "active" and fleet["instances"] == []
        # Applying again without current_resource: dstack's "Resource has been changed".
        again = await c.post("/api/project/main/fleets/apply", json=body)
        assert again.status_code == 400
        assert "Resource has been changed" in again.json()["detail"][0]["msg"]
        # With the current resource from a fresh plan it updates in place.
        plan = (
            await c.post(
                "/api/project/main/fleets/get_plan",
                json={"spec": {"configuration": {**SEED_FLEET, "nodes": "0..2"}, "profile": {}}},
            )
        ).json()
        assert plan["action"] == "update"
        upd = {
            "force": False,
            "plan": {
                "spec": {"configuration": {**SEED_FLEET, "nodes": "0..2"}, "profile": {}},
                "current_resource": plan["current_resource"],
            },
        }
        updated = (await c.post("/api/project/main/fleets/apply", json=upd)).json()
        assert updated["id"] == fleet["id"]
        assert updated["spec"]["configuration"]["nodes"]["max"] == 2
        got = (await c.post("/api/project/main/fleets/get", json={"name": "test-fleet"})).json()
        assert got["id"] == fleet["id"]
        assert len((await c.post("/api/fleets/list", json={})).json()) == 1
        assert len((await c.post("/api/project/main/fleets/list")).json()) == 1
        assert (await c.post("/api/project/main/fleets/delete", json={"names": ["nope"]})).json() is None
        assert (await c.post("/api/project/main/fleets/delete", json={"names": ["test-fleet"]})).status_code == 200


async def test_fleet_apply_requires_profile(server: RunningServer) -> None:
    async with server.client() as c:
        r = await c.post(
            "/api/project/main/fleets/apply",
            json={"force": True, "plan": {"spec": {"configuration": SEED_FLEET}}},
        )
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"] == ["body", "plan", "spec", "profile"]


async def test_bad_configuration_names_the_field(server: RunningServer) -> None:
    async with server.client() as c:
        r = await c.post(
            "/api/project/main/runs/apply",
            json={"force": False, "plan": {"run_spec": {"configuration": {"type": "task"}}}},
        )
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"][:4] == ["body", "plan", "run_spec", "configuration"]
        r = await c.post(
            "/api/project/main/runs/get_plan",
            json={
                "run_spec": {"configuration": {"type": "task", "commands": ["x"], "resources": {"gpu": "A100:lots"}}}
            },
        )
        assert r.status_code == 422
        assert "resources" in r.json()["detail"][0]["loc"]
        r = await c.post(
            "/api/project/main/fleets/get_plan",
            json={"spec": {"configuration": {"type": "fleet", "name": "x", "nodes": "3..1"}, "profile": {}}},
        )
        assert r.status_code == 422


async def test_seed_body_is_accepted_and_fails_without_fleet(server: RunningServer) -> None:
    async with server.client() as c:
        r = await c.post("/api/project/main/runs/apply", json=SEED_BODY)
        assert r.status_code == 200, r.text
        run = r.json()
        assert run["status"] == "submitted"
        assert run["run_spec"]["configuration"]["fleets"] == [{"project": None, "name": "test-fleet"}]
        name = run["run_spec"]["run_name"]

        async def failed() -> dict[str, Any] | None:
            got = await _run(c, name)
            return got if got["status"] == "failed" else None

        got = await wait_for(failed)
        sub = got["latest_job_submission"]
        assert sub["termination_reason"] == "failed_to_start_due_to_no_capacity"
        message = sub["termination_reason_message"]
        assert message.startswith("Failed to use specified fleets: no fleet named 'test-fleet'"), message
        assert got["termination_reason"] == "job_failed"


async def test_no_fleet_at_all_fails_with_dstack_message(server: RunningServer) -> None:
    async with server.client() as c:
        run = (await c.post("/api/project/main/runs/apply", json=task_body(["true"]))).json()

        async def failed() -> dict[str, Any] | None:
            got = await _run(c, run["run_spec"]["run_name"])
            return got if got["status"] == "failed" else None

        got = await wait_for(failed)
        sub = got["latest_job_submission"]
        assert sub["termination_reason_message"].startswith("No matching fleet found")
        # what to do here, not a page elsewhere; the status word dstack's server gives such a job
        assert "corral apply -f examples/fleet.dstack.yml" in sub["termination_reason_message"]
        assert "dstack.ai" not in sub["termination_reason_message"]
        assert sub["status_message"] == "no fleets"


async def test_task_runs_on_local_fleet_and_logs_come_back(server: RunningServer) -> None:
    async with server.client() as c:
        assert (await c.post("/api/project/main/fleets/apply", json=fleet_body())).status_code == 200
        body = task_body(["echo hello from $DSTACK_RUN_NAME", "echo oops >&2", "printf 'naïve ✓\\n'"])
        run = (await c.post("/api/project/main/runs/apply", json=body)).json()
        name = run["run_spec"]["run_name"]

        async def done() -> dict[str, Any] | None:
            got = await _run(c, name)
            return got if got["status"] in ("done", "failed", "terminated") else None

        got = await wait_for(done)
        assert got["status"] == "done", got
        sub = got["latest_job_submission"]
        assert sub["exit_status"] == 0 and sub["termination_reason"] == "done_by_runner"
        assert sub["job_provisioning_data"]["backend"] == "remote"
        out = await _logs(c, got)
        assert f"hello from {name}\n".encode() in out
        assert b"oops\n" in out
        assert "naïve ✓".encode() in out
        assert got["fleet"]["name"] == "fl"
        inst = (await c.post("/api/instances/list", json={})).json()
        assert len(inst) == 1 and inst[0]["status"] == "idle" and inst[0]["backend"] == "remote"
        # a local host: named by corral's id of the instance, and it bills nothing
        assert sub["job_provisioning_data"]["instance_id"] == inst[0]["id"]
        assert sub["job_provisioning_data"]["price"] == 0.0 and got["cost"] == 0.0


async def test_failing_task_reports_exit_status(server: RunningServer) -> None:
    async with server.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body())
        run = (await c.post("/api/project/main/runs/apply", json=task_body(["exit 3"]))).json()

        async def finished() -> dict[str, Any] | None:
            got = await _run(c, run["run_spec"]["run_name"])
            return got if got["status"] in ("done", "failed", "terminated") else None

        got = await wait_for(finished)
        assert got["status"] == "failed"
        sub = got["latest_job_submission"]
        assert sub["exit_status"] == 3
        assert sub["termination_reason"] == "container_exited_with_error"


async def test_image_without_container_runtime_fails_clearly(server: RunningServer) -> None:
    async with server.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body())
        run = (await c.post("/api/project/main/runs/apply", json=task_body(["true"], image="ubuntu:22.04"))).json()

        async def finished() -> dict[str, Any] | None:
            got = await _run(c, run["run_spec"]["run_name"])
            return got if got["status"] in ("done", "failed", "terminated") else None

        got = await wait_for(finished)
        sub = got["latest_job_submission"]
        assert got["status"] == "failed"
        assert sub["termination_reason"] == "creating_container_error"
        assert "container runtime" in sub["termination_reason_message"]


async def test_stop_running_task_then_delete(server: RunningServer) -> None:
    async with server.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body())
        run = (
            await c.post("/api/project/main/runs/apply", json=task_body(["echo started", "sleep 600"], name="sleeper"))
        ).json()

        async def running() -> bool:
            got = await _run(c, "sleeper")
            return got["status"] == "running" and b"started" in await _logs(c, got)

        await wait_for(running)
        r = await c.post("/api/project/main/runs/delete", json={"runs_names": ["sleeper"]})
        assert r.status_code == 400
        assert r.json()["detail"][0]["msg"] == "Cannot delete active run sleeper: stop it first"
        assert (
            await c.post("/api/project/main/runs/stop", json={"runs_names": ["sleeper"], "abort": False})
        ).json() is None

        async def terminated() -> dict[str, Any] | None:
            got = await _run(c, "sleeper")
            return got if got["status"] == "terminated" else None

        got = await wait_for(terminated)
        assert got["termination_reason"] == "stopped_by_user"
        assert got["latest_job_submission"]["termination_reason"] == "terminated_by_user"
        assert (await c.post("/api/project/main/runs/delete", json={"runs_names": ["sleeper"]})).status_code == 200
        assert (await c.post("/api/project/main/runs/get", json={"run_name": "sleeper"})).status_code == 400
        del run


async def test_apply_same_name_unchanged_keeps_run_id(server: RunningServer) -> None:
    async with server.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body())
        body = task_body(["sleep 30"], name="same")
        first = (await c.post("/api/project/main/runs/apply", json=body)).json()
        second = (await c.post("/api/project/main/runs/apply", json={**body, "force": True})).json()
        assert second["id"] == first["id"]
        changed = task_body(["sleep 31"], name="same")
        r = await c.post("/api/project/main/runs/apply", json=changed)
        assert r.status_code == 400
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["same"], "abort": True})


async def test_run_plan_shape(server: RunningServer) -> None:
    async with server.client() as c:
        plan = (
            await c.post("/api/project/main/runs/get_plan", json={"run_spec": SEED_BODY["plan"]["run_spec"]})
        ).json()
        assert plan["action"] == "create"
        assert plan["run_spec"]["repo_data"] == {"repo_type": "virtual"}
        assert plan["effective_run_spec"]["ssh_key_pub"].startswith("ssh-")
        jp = plan["job_plans"][0]
        assert set(jp) == {"job_spec", "offers", "total_offers", "max_price"}
        assert jp["job_spec"]["requirements"]["resources"]["cpu"]["count"]["min"] == 2


async def test_unsupported_types_validate_then_400(server: RunningServer) -> None:
    async with server.client() as c:
        svc = {"type": "service", "port": 8000, "commands": ["python -m http.server"], "gateway": "gw"}
        r = await c.post("/api/project/main/runs/get_plan", json={"run_spec": {"configuration": svc}})
        assert r.status_code == 400 and r.json()["detail"][0]["msg"] == "Gateway gw does not exist in project main"
        r = await c.post(
            "/api/project/main/runs/apply",
            json={"force": False, "plan": {"run_spec": {"configuration": svc}}},
        )
        assert r.status_code == 400 and r.json()["detail"][0]["code"] == "resource_not_exists"
        gw = {
            "type": "gateway",
            "name": "gw",
            "backend": "aws",
            "region": "us-east-1",
            "domain": "example.com",
        }
        r = await c.post("/api/project/main/gateways/get_plan", json={"spec": {"configuration": gw}})
        assert r.status_code == 400  # aws hosts gateways, but this project has no aws backend
        assert r.json()["detail"][0]["msg"].startswith("Project main has no aws backend")
        gcp = {**gw, "backend": "gcp"}
        r = await c.post("/api/project/main/gateways/get_plan", json={"spec": {"configuration": gcp}})
        assert r.status_code == 400
        assert r.json()["detail"][0]["msg"].startswith("Gateways are not supported for gcp backend")
        vol = {"type": "volume", "name": "vol", "backend": "aws", "region": "us-east-1", "size": "100GB"}
        r = await c.post("/api/project/main/volumes/create", json={"configuration": vol})
        assert r.status_code == 400
        r = await c.post("/api/project/main/volumes/create", json={"configuration": {"type": "volume", "bogus": 1}})
        assert r.status_code == 422


async def test_logs_poll_start_time_is_exclusive_and_pages(server: RunningServer) -> None:
    async with server.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body())
        run = (
            await c.post(
                "/api/project/main/runs/apply",
                json=task_body(["for i in 1 2 3 4 5; do echo line$i; sleep 0.05; done"], name="pager"),
            )
        ).json()

        async def done() -> dict[str, Any] | None:
            got = await _run(c, "pager")
            return got if got["status"] == "done" else None

        got = await wait_for(done)
        sub = got["latest_job_submission"]["id"]
        base = {"run_name": "pager", "job_submission_id": sub}
        page = (await c.post("/api/project/main/logs/poll", json={**base, "limit": 2})).json()
        assert len(page["logs"]) == 2 and page["next_token"]
        rest = (await c.post("/api/project/main/logs/poll", json={**base, "next_token": page["next_token"]})).json()
        assert len(rest["logs"]) == 3
        last = page["logs"][-1]["timestamp"]
        after = (await c.post("/api/project/main/logs/poll", json={**base, "start_time": last})).json()
        texts = [base64.b64decode(x["message"]) for x in after["logs"]]
        assert b"line2\n" not in texts and len(texts) == 3
        del run


async def test_waiting_run_shows_queue_position_and_starts_when_capacity_frees(server: RunningServer) -> None:
    async with server.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..1"))
        await c.post("/api/project/main/runs/apply", json=task_body(["sleep 600"], name="holder"))

        async def holding() -> bool:  # else the urgent run, submitted next, would rightly take the instance first
            return (await _run(c, "holder"))["status"] in ("provisioning", "pulling", "running")

        await wait_for(holding)
        await c.post("/api/project/main/runs/apply", json=task_body(["echo second"], name="second"))
        await c.post("/api/project/main/runs/apply", json=task_body(["echo urgent"], name="urgent", priority=50))

        async def queued() -> dict[str, Any] | None:
            got = await _run(c, "second")
            waiting = got["latest_job_submission"]["corral_waiting"]
            return got if got.get("corral_queue_position") == 2 and waiting else None

        second = await wait_for(queued)
        assert second["status"] == "submitted"
        assert "Waiting for capacity" in second["latest_job_submission"]["corral_waiting"]
        assert (await _run(c, "urgent"))["corral_queue_position"] == 1
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["holder"], "abort": False})

        async def both_done() -> bool:
            statuses = [(await _run(c, n))["status"] for n in ("second", "urgent")]
            return statuses == ["done", "done"]

        await wait_for(both_done, timeout=30)
        # The higher-priority run took the freed instance first.
        urgent, second = await _run(c, "urgent"), await _run(c, "second")
        assert urgent["latest_job_submission"]["finished_at"] <= second["latest_job_submission"]["finished_at"]


async def test_runs_list_keyset_pages_are_exact(server: RunningServer) -> None:
    async with server.client() as c:
        for i in range(7):
            await c.post("/api/project/main/runs/apply", json=task_body(["true"], name=f"page{i}"))
        seen: list[str] = []
        prev: dict[str, Any] = {}
        while True:
            page = (await c.post("/api/runs/list", json={"limit": 3, **prev})).json()
            if not page:
                break
            seen += [r["run_spec"]["run_name"] for r in page]
            prev = {"prev_submitted_at": page[-1]["submitted_at"], "prev_run_id": page[-1]["id"]}
        assert seen == [f"page{i}" for i in reversed(range(7))]


async def test_apply_response_is_what_a_read_gives(tmp_path: Path) -> None:
    """``runs/apply`` answers from what it wrote (no read-back): the same document ``runs/get`` reads."""
    async with running_server(make_settings(tmp_path, background_processing=False)) as s, s.client() as c:
        for name, extra in (("single", {}), ("multi", {"nodes": 2, "env": {"A": "1"}, "priority": 7})):
            applied = (
                await c.post("/api/project/main/runs/apply", json=task_body(["true"], name=name, **extra))
            ).json()
            read = await _run(c, name)
            read.pop("corral_queue_position", None)
            assert applied == read
