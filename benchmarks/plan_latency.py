#!/usr/bin/env python3
"""``runs/get_plan`` latency: the plan carries the scheduler's verdict, computed from the fleets as they are.

Starts `corral server` as a process with fresh state, creates F fleets (no instances), then times R
sequential `runs/get_plan` calls of a task that fits (verdict: none) and of one naming an unknown fleet
(verdict: a refusal), and prints the medians and 99th percentiles. Figures, not assertions.

    python benchmarks/plan_latency.py [--fleets 20] [--requests 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.load import pct
from benchlib.servers import free_port

RES = {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."}


async def timed(c: httpx.AsyncClient, fleets: list[str], n: int) -> tuple[list[float], object]:
    body = {"run_spec": {"configuration": {"type": "task", "commands": ["true"], "resources": RES, "fleets": fleets}}}
    out: list[float] = []
    verdict: object = None
    for _ in range(n):
        t = time.perf_counter()
        r = await c.post("/api/project/main/runs/get_plan", json=body)
        out.append(time.perf_counter() - t)
        r.raise_for_status()
        verdict = r.json().get("corral_plan_error")
    return out, verdict


async def main_async(n_fleets: int, n_requests: int) -> None:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "CORRAL_SERVER_DIR": f"{tmp}/state",
            "CORRAL_CONFIG_DIR": f"{tmp}/cli",
            "CORRAL_SERVER_ADMIN_TOKEN": "bench",
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "corral.cli.main", "server", "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            async with httpx.AsyncClient(base_url=url, headers={"Authorization": "Bearer bench"}, timeout=60) as c:
                while True:
                    try:
                        await c.get("/healthcheck")
                        break
                    except httpx.HTTPError:
                        await asyncio.sleep(0.05)
                for i in range(n_fleets):
                    fleet = {"type": "fleet", "name": f"f{i}", "nodes": "0..2", "resources": RES}
                    r = await c.post(
                        "/api/project/main/fleets/apply",
                        json={"force": True, "plan": {"spec": {"configuration": fleet, "profile": {}}}},
                    )
                    r.raise_for_status()
                await timed(c, ["f0"], 20)  # warm-up: first-use imports
                fits, none = await timed(c, ["f0"], n_requests)
                refused, why = await timed(c, ["does-not-exist"], n_requests)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print(f"machine: {os.cpu_count()} CPUs; {n_fleets} fleets, {n_requests} sequential runs/get_plan per case")
    for label, lat in ((f"a task that fits (verdict {none!r})", fits), ("an unknown fleet (refused)", refused)):
        print(f"{label}: p50 {pct(lat, 0.5) * 1000:.1f} ms, p99 {pct(lat, 0.99) * 1000:.1f} ms")
    print(f"  verdict: {why}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fleets", type=int, default=20)
    p.add_argument("--requests", type=int, default=200)
    args = p.parse_args()
    asyncio.run(main_async(args.fleets, args.requests))


if __name__ == "__main__":
    main()
