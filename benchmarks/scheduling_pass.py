#!/usr/bin/env python3
"""One scheduling pass over a backlog: what the scheduler worker costs each time it is woken while a queue
of short jobs waits for a busy fleet (in a drain, a pass runs for every job that ends).

An in-process server (SQLite, the local backend) with a fleet of 4 local instances, each held by a long job,
and ``--queued`` trivial runs waiting behind them. Then the worker's own pass (load the queue and the fleets,
decide, commit) is run ``--passes`` times on the loop with nothing else to do, and timed: the pass as a
whole (CPU and wall), a fresh worker's first pass (every queued job read and taken: a restart), and with
``--profile`` the functions it spends its time in. Figures, not assertions.

    python benchmarks/scheduling_pass.py [--queued 400] [--passes 50] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.in_process import in_process_server

RES = {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."}


def _run_body(commands: list[str]) -> dict[str, object]:
    conf = {"type": "task", "commands": commands, "resources": RES, "fleets": ["busy"]}
    return {"force": False, "plan": {"run_spec": {"configuration": conf}}}


async def _instances(c: httpx.AsyncClient, status: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while sum(i["status"] == status for i in (await c.post("/api/instances/list", json={})).json()) < 4:
        if time.monotonic() > deadline:
            raise SystemExit(f"the fleet's 4 instances did not become {status} in {timeout:.0f} s")
        await asyncio.sleep(0.1)


async def main_async(queued: int, passes: int, profile: bool) -> None:
    from corral.workers.scheduling import Scheduling

    overrides = {"local_max_instances": 8, "local_cpus": 16, "local_memory_mib": 128 * 1024}  # room for 4 instances
    async with in_process_server("corral-bench-pass-", **overrides) as srv:
        headers = {"Authorization": f"Bearer {srv.token}"}
        async with httpx.AsyncClient(base_url=srv.url, headers=headers, timeout=60) as c:
            fleet = {"type": "fleet", "name": "busy", "nodes": 4, "resources": RES}
            spec = {"configuration": fleet, "profile": {}}
            body = {"force": True, "plan": {"spec": spec}}
            (await c.post("/api/project/main/fleets/apply", json=body)).raise_for_status()
            await _instances(c, "idle")
            for _ in range(4):
                (await c.post("/api/project/main/runs/apply", json=_run_body(["sleep 600"]))).raise_for_status()
            await _instances(c, "busy")
            for _ in range(queued):
                (await c.post("/api/project/main/runs/apply", json=_run_body(["echo ok"]))).raise_for_status()
            worker = Scheduling(srv.prepared.ctx)
            for _ in range(3):  # the queue's documents parsed once, the waits' messages written
                await worker.pass_once()
            await asyncio.sleep(2.0)  # the server's own passes after the submissions are over
            first = []  # a worker's first pass (a restart, a new replica): every queued job is read and taken
            for _ in range(max(3, passes // 10)):
                c0 = time.process_time()
                await Scheduling(srv.prepared.ctx).pass_once()
                first.append(time.process_time() - c0)
            cpu, wall = [], []
            prof = cProfile.Profile() if profile else None
            for _ in range(passes):
                c0, w0 = time.process_time(), time.perf_counter()
                if prof is not None:
                    prof.enable()
                await worker.pass_once()
                if prof is not None:
                    prof.disable()
                cpu.append(time.process_time() - c0)
                wall.append(time.perf_counter() - w0)
            await c.post("/api/project/main/runs/stop", json={"runs_names": [], "abort": True})
    ms = 1000
    print(f"one scheduling pass, {queued} jobs queued behind a busy fleet of 4 ({passes} passes):")
    print(
        f"  CPU median {statistics.median(cpu) * ms:.2f} ms (min {min(cpu) * ms:.2f}), "
        f"wall median {statistics.median(wall) * ms:.2f} ms"
    )
    print(
        "  a fresh worker's first pass (reads and takes every queued job): "
        f"CPU median {statistics.median(first) * ms:.2f} ms"
    )
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(40)
        print(out.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queued", type=int, default=400)
    parser.add_argument("--passes", type=int, default=50)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    asyncio.run(main_async(args.queued, args.passes, args.profile))


if __name__ == "__main__":
    main()
