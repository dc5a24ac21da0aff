"""A local instance whose agent stops answering (SIGKILL, or SIGSTOP: hung) is given up within 30 s with the
production defaults: its job fails ``instance_unreachable``, the instance is terminated and leaves nothing
behind (its job's processes, its sandbox slot), and the run's ``retry`` runs the job again on a replacement,
on a fleet of one (``nodes: 0..1``), whose cap is never passed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from corral.store.tables import instances
from server_harness import RunningServer, fleet_body, get_run, make_settings, running_server, task_body, wait_for
from skip_policy import needs_root

pytestmark = needs_root("the sandbox needs root (CI runs as root)")

#: The bound the issue asks of the local backend, with every setting at its default.
LOCAL_BOUND = 30.0
#: A sleep no other test runs, to find the job's process on the host.
SLEEP = "sleep 613"


async def _live_instances(s: RunningServer) -> list[Any]:
    async with s.ctx.db.read() as conn:
        rows = (await conn.execute(sa.select(instances))).all()
    return [r for r in rows if r.status != "terminated"]


async def _most_live(s: RunningServer, stop: asyncio.Event, seen: list[int]) -> None:
    while not stop.is_set():
        seen.append(len(await _live_instances(s)))
        await asyncio.sleep(0.05)


def _slot_records(work_dir: str) -> list[str]:
    slots = Path("/run/corral-sandbox/slots")
    found = []
    for p in slots.glob("*.json") if slots.is_dir() else ():
        try:
            if json.loads(p.read_text()).get("work_dir") == work_dir:
                found.append(p.name)
        except (OSError, ValueError):
            continue
    return found


async def _lose_the_agent(tmp_path: Path, sig: signal.Signals) -> None:
    # every bound at its default: the jobs worker's own timeout (120 s) must not be what ends the job
    settings = make_settings(tmp_path, sandbox="on", agent_unreachable_timeout=120.0, instance_check_interval=10.0)
    assert settings.local_agent_unreachable_timeout == 10.0
    async with running_server(settings) as s, s.client() as c:
        assert (await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..1"))).status_code == 200
        retry = {"on_events": ["error"], "duration": "1h"}
        body = task_body([f"exec {SLEEP}"], name="lost", fleets=["fl"], retry=retry)
        assert (await c.post("/api/project/main/runs/apply", json=body)).status_code == 200

        async def running(num: int) -> dict[str, Any] | None:
            sub = (await get_run(c, "lost"))["jobs"][0]["job_submissions"]
            return sub[-1] if len(sub) > num and sub[num]["status"] == "running" else None

        first = await wait_for(lambda: running(0), timeout=60)
        (inst,) = await _live_instances(s)
        agent = json.loads(inst.agent) if isinstance(inst.agent, str) else inst.agent
        work_dir = str(agent["work_dir"])
        await wait_for(lambda: asyncio.to_thread(_slot_records, work_dir), timeout=10)
        stop, seen = asyncio.Event(), list[int]()
        sampling = asyncio.create_task(_most_live(s, stop, seen))
        lost_at = time.monotonic()
        os.kill(int(agent["pid"]), sig)

        async def failed() -> dict[str, Any] | None:
            subs = (await get_run(c, "lost"))["jobs"][0]["job_submissions"]
            return subs[0] if subs[0]["status"] == "failed" else None

        ended = await wait_for(failed, timeout=LOCAL_BOUND + 15)
        given_up_after = time.monotonic() - lost_at
        assert given_up_after <= LOCAL_BOUND, given_up_after
        assert ended["termination_reason"] == "instance_unreachable", ended
        second = await wait_for(lambda: running(1), timeout=60)
        assert second["id"] != first["id"]
        stop.set()
        await sampling
        async with s.ctx.db.read() as conn:
            old = (await conn.execute(sa.select(instances).where(instances.c.id == inst.id))).one()
        assert old.status == "terminated" and old.termination_reason == "unreachable", old
        assert max(seen) <= 1, f"the fleet's cap (1) was passed: {max(seen)}"
        # nothing of the lost agent is left: its job's process and its sandbox slot
        assert not _slot_records(work_dir)
        left = subprocess.run(["pgrep", "-f", SLEEP], capture_output=True, text=True).stdout.split()
        (replacement,) = await _live_instances(s)
        assert replacement.id != inst.id and len(left) == 1, left  # the retry's own sleep only
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["lost"], "abort": True})
        await wait_for(lambda: _gone(c), timeout=30)


async def _gone(c: httpx.AsyncClient) -> bool:
    return (await get_run(c, "lost"))["status"] in ("terminated", "failed", "done")


async def test_a_killed_local_agent_is_given_up_within_30s_and_its_job_runs_again_on_a_replacement(
    tmp_path: Path,
) -> None:
    await _lose_the_agent(tmp_path, signal.SIGKILL)


async def test_a_hung_local_agent_is_given_up_within_30s_and_leaves_no_process_or_slot(tmp_path: Path) -> None:
    await _lose_the_agent(tmp_path, signal.SIGSTOP)
