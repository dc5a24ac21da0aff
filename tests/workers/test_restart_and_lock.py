"""A restarted server finds its agents (and their jobs) again; agents nobody owns are reaped; a second
server on the same state directory refuses to start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from corral.server import StateDirLocked, lock_state_dir
from server_harness import fleet_body, make_settings, running_server, task_body, wait_for


async def test_start_reaps_agents_no_instance_owns(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    orphan = settings.instances_dir / "not-a-known-instance"
    orphan.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    (orphan / "agent.pid").write_text(str(proc.pid))
    async with running_server(settings):
        # killed well before its 60 s: -9, or 0 where the server (this same process) reaped it first
        assert proc.wait(timeout=10) in (0, -9)
        assert not orphan.exists()


async def test_server_restart_reattaches_to_live_agent(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    prepared_state: dict[str, Any] = {}
    async with running_server(settings) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body())
        await c.post(
            "/api/project/main/runs/apply", json=task_body(["echo before", "sleep 3", "echo after"], name="reattach")
        )

        async def running() -> bool:
            r = (await c.post("/api/project/main/runs/get", json={"run_name": "reattach"})).json()
            return bool(r["status"] == "running")

        await wait_for(running)
        insts = (await c.post("/api/instances/list", json={})).json()
        prepared_state["instance"] = insts[0]["id"]
        # Keep the agent alive across the restart: mark it known so teardown does not reap it.
        for compute in s.ctx.computes.values():
            compute.reap_unknown = _keep  # type: ignore[method-assign]
    async with running_server(settings) as s2, s2.client() as c2:

        async def done() -> dict[str, Any] | None:
            r = (await c2.post("/api/project/main/runs/get", json={"run_name": "reattach"})).json()
            return r if r["status"] in ("done", "failed", "terminated") else None

        r = await wait_for(done, timeout=30)
        assert r["status"] == "done", r
        sub = r["latest_job_submission"]
        logs = (
            await c2.post(
                "/api/project/main/logs/poll",
                json={"run_name": "reattach", "job_submission_id": sub["id"], "limit": 100},
            )
        ).json()["logs"]
        import base64

        text = b"".join(base64.b64decode(x["message"]) for x in logs)
        assert b"before" in text and b"after" in text
        insts = (await c2.post("/api/instances/list", json={})).json()
        assert [i["id"] for i in insts] == [prepared_state["instance"]]


async def _keep(_known: set[str]) -> list[str]:
    return []


def test_second_server_on_same_state_dir_refuses(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    held = lock_state_dir(settings)
    try:
        with pytest.raises(StateDirLocked, match="already using the state directory"):
            lock_state_dir(settings)
        env = {**os.environ, "CORRAL_SERVER_DIR": str(settings.server_dir)}
        out = subprocess.run(
            [sys.executable, "-m", "corral.cli.main", "server", "--port", "1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode != 0
        assert "already using the state directory" in out.stderr + out.stdout
        assert "Traceback" not in out.stderr
    finally:
        held.close()
