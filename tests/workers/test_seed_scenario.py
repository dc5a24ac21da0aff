"""The seed bug, end to end on the local backend: concurrent runs/apply never exceed nodes.max, the runs
that do not fit wait in the queue (not fail), and all of them finish as capacity frees."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from server_harness import RunningServer, fleet_body, task_body, wait_for


async def test_ten_concurrent_applies_three_nodes(server: RunningServer) -> None:
    samples: list[int] = []
    stop = asyncio.Event()

    async def sampler(c: httpx.AsyncClient) -> None:
        while not stop.is_set():
            insts = (await c.post("/api/instances/list", json={})).json()
            samples.append(sum(1 for i in insts if i["status"] != "terminated"))
            await asyncio.sleep(0.02)

    async with server.client() as c:
        r = await c.post("/api/project/main/fleets/apply", json=fleet_body(name="test-fleet", nodes="0..3"))
        assert r.status_code == 200
        sampling = asyncio.create_task(sampler(c))
        body = task_body(["date", "sleep 1", "date"], fleets=["test-fleet"], creation_policy="reuse-or-create")
        started = time.monotonic()
        applied = await asyncio.gather(
            *(c.post("/api/project/main/runs/apply", json={**body, "force": True}) for _ in range(10))
        )
        assert all(a.status_code == 200 for a in applied)
        names = [a.json()["run_spec"]["run_name"] for a in applied]
        assert len(set(names)) == 10

        async def all_finished() -> list[dict[str, Any]] | None:
            runs = (await c.post("/api/runs/list", json={})).json()
            mine = [r for r in runs if r["run_spec"]["run_name"] in names]
            return mine if all(r["status"] in ("done", "failed", "terminated") for r in mine) else None

        finished = await wait_for(all_finished, timeout=60, interval=0.2)
        stop.set()
        await sampling
        assert [r["status"] for r in finished] == ["done"] * 10, [
            (r["status"], r["latest_job_submission"]["termination_reason_message"]) for r in finished
        ]
        assert samples and max(samples) <= 3, max(samples)
        insts = (await c.post("/api/instances/list", json={})).json()
        assert len({i["instance_num"] for i in insts}) <= 3
        # Ten 1-second jobs on three instances: about four rounds, with no retry-timer gaps.
        assert time.monotonic() - started < 30
