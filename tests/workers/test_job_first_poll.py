"""A job's start hands its follower the first long poll of the agent, sent while the start is recorded: a short
job ends from that poll, and a stop asked for while it is in flight is sent at once (the poll is cut short), not
when the poll would end (real server, agents and jobs)."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from corral.agent.protocol import JobState, JobSubmission
from corral.backends.agent_client import AgentClient
from server_harness import fleet_body, get_run, make_settings, running_server, task_body, wait_for

POLL_WAIT = 20.0  # the follower's long poll: a stop that waited for it would take this long


async def _stopped_by_user_at_once(c: Any, name: str, asked: float) -> None:
    """Run ``name`` ends terminated by its user's stop (asked for at ``asked``), well before a long poll would."""

    async def stopped() -> dict[str, Any] | None:
        run = await get_run(c, name)
        return run if run["status"] in ("terminated", "failed", "done") else None

    run = await wait_for(stopped, timeout=POLL_WAIT)
    assert time.monotonic() - asked < POLL_WAIT / 2, "the stop waited for the first long poll to end"
    sub = run["jobs"][0]["job_submissions"][-1]
    assert (run["status"], sub["termination_reason"]) == ("terminated", "terminated_by_user"), run


async def test_a_stop_cuts_the_first_poll_short_and_a_short_job_ends_from_it(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path, agent_poll_wait=POLL_WAIT)) as srv, srv.client() as c:
        assert (await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes=1))).status_code == 200
        r = await c.post("/api/project/main/runs/apply", json=task_body(["echo first"], name="short"))
        assert r.status_code == 200, r.text

        async def done() -> bool:
            return bool((await get_run(c, "short"))["status"] == "done")

        await wait_for(done, timeout=60)
        r = await c.post("/api/project/main/runs/apply", json=task_body(["sleep 600"], name="long"))
        assert r.status_code == 200, r.text

        async def running() -> bool:
            return bool((await get_run(c, "long"))["status"] == "running")

        await wait_for(running, timeout=30, interval=0.01)
        asked = time.monotonic()
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["long"], "abort": False})
        await _stopped_by_user_at_once(c, "long", asked)


async def test_a_stop_asked_for_while_the_agent_starts_the_job_is_sent_once_the_start_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop that came while the job's submission to its agent was in flight was recorded at once as the job's
    end, with its instance given back, and the submission's own write then found the job no longer starting:
    the agent ran the job on, followed by none. The stop now waits for the start to be recorded and is sent to
    the agent at once."""
    in_flight, go_on = asyncio.Event(), asyncio.Event()
    real_submit = AgentClient.submit

    async def held_submit(self: AgentClient, sub: JobSubmission) -> JobState:
        if sub.run_name == "long":
            in_flight.set()
            await go_on.wait()
        return await real_submit(self, sub)

    monkeypatch.setattr(AgentClient, "submit", held_submit)
    marker = f"corral-stop-in-flight-{uuid.uuid4().hex[:12]}"
    async with running_server(make_settings(tmp_path, agent_poll_wait=POLL_WAIT)) as srv, srv.client() as c:
        assert (await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes=1))).status_code == 200
        r = await c.post("/api/project/main/runs/apply", json=task_body([f"sleep 600; echo {marker}"], name="long"))
        assert r.status_code == 200, r.text
        await asyncio.wait_for(in_flight.wait(), 60)
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["long"], "abort": False})
        await asyncio.sleep(1.0)  # the jobs worker's pass on the stop, while the agent has not answered yet
        go_on.set()
        await _stopped_by_user_at_once(c, "long", time.monotonic())

        def left_running() -> bool:
            return subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0

        deadline = time.monotonic() + 10
        while left_running() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not left_running(), "the job was left running on its agent"
