"""A job's start hands its follower the first long poll of the agent, sent while the start is recorded: a short
job ends from that poll, and a stop asked for while it is in flight is sent at once (the poll is cut short), not
when the poll would end (real server, agents and jobs)."""

from __future__ import annotations

import time
from pathlib import Path

from server_harness import fleet_body, get_run, make_settings, running_server, task_body, wait_for

POLL_WAIT = 20.0  # the follower's long poll: a stop that waited for it would take this long


async def test_a_stop_cuts_the_first_poll_short_and_a_short_job_ends_from_it(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path, agent_poll_wait=POLL_WAIT)) as srv, srv.client() as c:
        assert (await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes=1))).status_code == 200
        r = await c.post("/api/project/main/runs/apply", json=task_body(["echo first"], name="short"))
        assert r.status_code == 200, r.text

        async def done() -> bool:
            return (await get_run(c, "short"))["status"] == "done"

        await wait_for(done, timeout=60)
        r = await c.post("/api/project/main/runs/apply", json=task_body(["sleep 600"], name="long"))
        assert r.status_code == 200, r.text

        async def running() -> bool:
            return (await get_run(c, "long"))["status"] == "running"

        await wait_for(running, timeout=30, interval=0.01)
        asked = time.monotonic()
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["long"], "abort": False})

        async def stopped() -> dict[str, object] | None:
            run = await get_run(c, "long")
            return run if run["status"] in ("terminated", "failed", "done") else None

        run = await wait_for(stopped, timeout=POLL_WAIT)
        assert time.monotonic() - asked < POLL_WAIT / 2, "the stop waited for the first long poll to end"
        sub = run["jobs"][0]["job_submissions"][-1]
        assert (run["status"], sub["termination_reason"]) == ("terminated", "terminated_by_user"), run
