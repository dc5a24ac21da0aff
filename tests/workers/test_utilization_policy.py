"""``utilization_policy`` end to end (a real server and local agent, the fake ``nvidia-smi`` of a captured
H100 idle at 0 %): a job whose GPU stayed under ``min_gpu_utilization`` for its whole ``time_window`` is
terminated as dstack 0.22.5 terminates it -- ``terminated_due_to_utilization_policy`` with dstack's message, the
run ``failed``/``job_failed`` -- and a window longer than the samples are kept is a 400 naming the limit.

The five-minute window's samples are written into the store backdated, with the agent's sampling off: a
sample older than the job's newest stored one is never stored, so one from the agent first would shut them
out. The short window's test judges the agent's own samples."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from corral.domain.metrics import MetricsPoint
from corral.settings import Settings, SettingsError
from corral.store import metrics as metrics_store
from corral.workers.jobs import utilization as job_utilization
from nvidia_smi_fake import install
from server_harness import fleet_body, get_run, make_settings, running_server, task_body, wait_for

GPU = {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB..", "gpu": 1}


async def test_an_idle_gpu_job_is_terminated_by_its_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(tmp_path / "bin")  # an H100 idle at 0 % (captured output)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("CORRAL_AGENT_METRICS_INTERVAL", "0")  # only the samples written below
    monkeypatch.setattr(job_utilization, "CHECK_EVERY_S", 0.3)
    policy = {"min_gpu_utilization": 10, "time_window": "5m"}
    async with running_server(make_settings(tmp_path, agent_poll_wait=1.0)) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..1", resources=GPU))
        too_long = task_body(
            ["sleep 600"], name="too-long", resources=GPU, utilization_policy={**policy, "time_window": "2h"}
        )
        r = await c.post("/api/project/main/runs/apply", json=too_long)
        assert r.status_code == 400 and "Maximum utilization_policy.time_window is 3600s" in r.text, r.text

        body = task_body(["sleep 600"], name="idle-gpu", resources=GPU, utilization_policy=policy)
        assert (await c.post("/api/project/main/runs/apply", json=body)).status_code == 200

        async def running() -> str | None:
            run = await get_run(c, "idle-gpu")
            sub = run["latest_job_submission"]
            return sub["id"] if sub["status"] == "running" else None

        job_id = await wait_for(running, timeout=60)
        assert (await get_run(c, "idle-gpu"))["jobs"][0]["job_spec"]["utilization_policy"] == {
            "min_gpu_utilization": 10, "time_window": 300,
        }  # fmt: skip
        now = time.time()
        earlier = [
            MetricsPoint(int((now - 300 + i * 10) * 1e6), 0, 1, 1, (100,), (3,))
            for i in range(31)  # 300 s ago up to now, every 10 s: the window is covered
        ]
        async with s.ctx.db.write() as conn:
            assert await metrics_store.add_points(conn, job_id, earlier) == 31

        async def ended() -> dict[str, object] | None:
            run = await get_run(c, "idle-gpu")
            return run if run["status"] in ("failed", "done", "terminated") else None

        run = await wait_for(ended, timeout=30)
        sub = run["latest_job_submission"]
        assert (run["status"], run["termination_reason"]) == ("failed", "job_failed"), run
        assert (sub["status"], sub["termination_reason"]) == ("terminated", "terminated_due_to_utilization_policy")
        assert sub["termination_reason_message"] == "The job GPU utilization below 10% for 300 seconds"


async def test_a_short_window_needs_the_servers_check_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``CORRAL_UTILIZATION_MIN_WINDOW`` (for checks) lowers the 5-minute minimum: a 3 s window is refused
    without it (dstack's message) and under a higher minimum (naming it), and with it the idle job is ended
    within a few seconds, looked at four times per window rather than every 20 s (nothing patched here)."""
    with pytest.raises(SettingsError, match="from 1 to 300"):
        Settings.from_env({"CORRAL_UTILIZATION_MIN_WINDOW": "0.5"})
    assert Settings.from_env({"CORRAL_UTILIZATION_MIN_WINDOW": "2"}).utilization_min_window == 2.0
    install(tmp_path / "bin")  # an H100 idle at 0 % (captured output)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("CORRAL_AGENT_METRICS_INTERVAL", "0.3")
    policy = {"min_gpu_utilization": 10, "time_window": "3s"}
    body = task_body(["sleep 600"], name="short-window", resources=GPU, utilization_policy=policy)
    async with running_server(make_settings(tmp_path / "a")) as s, s.client() as c:
        r = await c.post("/api/project/main/runs/apply", json=body)
        assert r.status_code == 422 and "Minimum time_window is 5m" in r.text, r.text
    async with running_server(make_settings(tmp_path / "b", utilization_min_window=10.0)) as s, s.client() as c:
        r = await c.post("/api/project/main/runs/get_plan", json={"run_spec": body["plan"]["run_spec"]})
        assert r.status_code == 422 and "Minimum time_window is 10s" in r.text, r.text
    settings = make_settings(tmp_path / "c", agent_poll_wait=1.0, utilization_min_window=2.0)
    async with running_server(settings) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..1", resources=GPU))
        assert (await c.post("/api/project/main/runs/apply", json=body)).status_code == 200

        async def ended() -> dict[str, object] | None:
            run = await get_run(c, "short-window")
            return run if run["status"] in ("failed", "done", "terminated") else None

        run = await wait_for(ended, timeout=15)  # every 20 s, the first judgement would come after 20 s
        sub = run["latest_job_submission"]
        assert (sub["status"], sub["termination_reason"]) == ("terminated", "terminated_due_to_utilization_policy")
        assert sub["termination_reason_message"] == "The job GPU utilization below 10% for 3 seconds"
