"""`runs/apply` and `runs/get_plan` checks of container options that need no Docker engine: volumes a job
cannot get."""

from __future__ import annotations

from server_harness import RunningServer, task_body


async def test_a_missing_network_volume_is_refused_clearly(server: RunningServer) -> None:
    async with server.client() as c:
        body = task_body(["true"], image="ubuntu:22.04", volumes=["my-vol:/data", "/host:/mnt"])
        r = await c.post("/api/project/main/runs/apply", json=body)
        assert r.status_code == 400
        message = "Volume my-vol not found: create it first (`type: volume`), or fix `volumes`"
        assert r.json()["detail"][0]["msg"] == message
        # the plan says so too (as dstack's does), never a server error
        plan = await c.post("/api/project/main/runs/get_plan", json={"run_spec": body["plan"]["run_spec"]})
        assert plan.status_code == 400 and plan.json()["detail"][0]["msg"] == message
