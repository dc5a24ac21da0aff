"""The seed scenario, literally: a `corral server` process with the local backend, fleet `test-fleet`
(`nodes: 0..3`, `resources: {cpu: 1..}`), the seed's loop of 10 `runs/apply` calls (its body without
`image`), then 50 concurrent submitters (`sleep 1`). A sampler polls `instances/list` every 50 ms: at most
3 non-terminated instances at every sample; every run ends `done`; instances were reused."""

from __future__ import annotations

import asyncio
import copy
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

TOKEN = "seed-token"
SEED_BODY: dict[str, Any] = {
    "force": True,
    "plan": {
        "run_spec": {
            "configuration": {
                "type": "task",
                "creation_policy": "reuse-or-create",
                "commands": ["date", "sleep 6", "date"],
                "fleets": ["test-fleet"],
            }
        }
    },
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_seed_scenario_against_server_process(tmp_path: Path) -> None:
    port = _free_port()
    env = {
        **os.environ,
        "CORRAL_SERVER_DIR": str(tmp_path / "server"),
        "CORRAL_CONFIG_DIR": str(tmp_path / "cli"),
        "CORRAL_SERVER_ADMIN_TOKEN": TOKEN,
        "CORRAL_SAFETY_NET_INTERVAL": "60",
        "CORRAL_LOCAL_MAX_INSTANCES": "8",  # the fleet's nodes.max, not the machine, is the limit under test
        "CORRAL_LOCAL_CPUS": "16",
        "CORRAL_LOCAL_MEMORY": "128GB",
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "corral.cli.main", "server", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as c:
            deadline = time.monotonic() + 30
            while True:
                try:
                    await c.get("/healthcheck")
                    break
                except httpx.HTTPError:
                    assert server.poll() is None and time.monotonic() < deadline
                    await asyncio.sleep(0.05)
            fleet = {"type": "fleet", "name": "test-fleet", "nodes": "0..3", "resources": {"cpu": "1.."}}
            r = await c.post(
                "/api/project/main/fleets/apply",
                json={"force": False, "plan": {"spec": {"configuration": fleet, "profile": {}}}},
            )
            assert r.status_code == 200, r.text

            samples: list[int] = []
            seen: set[str] = set()
            stop = asyncio.Event()

            async def sampler() -> None:
                while not stop.is_set():
                    insts = (await c.post("/api/instances/list", json={})).json()
                    samples.append(sum(1 for i in insts if i["status"] != "terminated"))
                    seen.update(i["id"] for i in insts)
                    await asyncio.sleep(0.05)

            sampling = asyncio.create_task(sampler())
            names = []
            for _ in range(10):  # the seed's loop
                r = await c.post("/api/project/main/runs/apply", json=SEED_BODY)
                assert r.status_code == 200, r.text
                names.append(r.json()["run_spec"]["run_name"])
            quick = copy.deepcopy(SEED_BODY)
            quick["plan"]["run_spec"]["configuration"]["commands"] = ["date", "sleep 1", "date"]
            replies = await asyncio.gather(*(c.post("/api/project/main/runs/apply", json=quick) for _ in range(50)))
            assert all(r.status_code == 200 for r in replies)
            names += [r.json()["run_spec"]["run_name"] for r in replies]
            assert len(set(names)) == 60

            deadline = time.monotonic() + 240
            while True:
                runs = (await c.post("/api/runs/list", json={"limit": 100})).json()
                mine = {r["run_spec"]["run_name"]: r for r in runs if r["run_spec"]["run_name"] in names}
                if len(mine) == 60 and all(r["status"] in ("done", "failed", "terminated") for r in mine.values()):
                    break
                assert time.monotonic() < deadline, sorted({r["status"] for r in mine.values()})
                await asyncio.sleep(0.5)
            stop.set()
            await sampling
            bad = [
                (n, r["status"], r["latest_job_submission"]["termination_reason_message"])
                for n, r in mine.items()
                if r["status"] != "done"
            ]
            assert not bad, bad
            assert samples and max(samples) <= 3, max(samples)
            assert max(samples) == 3  # the fleet did grow to its limit (the limit, not the machine, held it)
            assert len(seen) <= 3  # the 60 runs reused the same instances
    finally:
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as c:
            try:
                await c.post("/api/project/main/fleets/delete", json={"names": ["test-fleet"]})
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    insts = (await c.post("/api/instances/list", json={})).json()
                    if all(i["status"] == "terminated" for i in insts):
                        break
                    await asyncio.sleep(0.2)
            except httpx.HTTPError:
                pass
        server.terminate()
        server.wait(30)
