#!/usr/bin/env python3
"""The web UI's server time per page with 1,000 runs (100 running) and 50 fleets of 4 instances each: every
page requested through the whole app in process (session cookie, routing, the services' reads, Jinja2), by
httpx's ASGI transport (no sockets): wall time, and the process's CPU time (the same on a quiet machine;
the better figure on a busy one). Figures, not assertions.

    python benchmarks/ui_render.py [--runs 1000] [--fleets 50] [--repeats 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import httpx
import sqlalchemy as sa
from benchlib.metrics_rows import fresh, runs_with_jobs

from corral.api.app import create_app
from corral.context import Context
from corral.services import ui_sessions
from corral.settings import Settings
from corral.store import tables as t
from corral.store.accounts import token_hash

TOKEN = "bench-token"
OFFER = {"instance_type": "local", "resources": {"cpus": 16, "memory_mib": 131072, "gpus": [], "disk_size_mib": 102400}}


class _NoWorkers:
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def seed_fleets(db: object, n: int, per: int, now: float) -> None:
    spec = json.dumps({"configuration": {"type": "fleet", "nodes": f"0..{per}"}, "profile": {}})
    fleets, instances = [], []
    for f in range(n):
        fleets.append({"id": f"f{f}", "project_id": "p", "name": f"fleet-{f}", "created_at": now,
                       "last_processed_at": now, "status": "active", "spec": spec, "deleted": False})  # fmt: skip
        for i in range(per):
            instances.append({"id": f"f{f}-i{i}", "project_id": "p", "fleet_id": f"f{f}", "name": f"fleet-{f}-{i}",
                              "instance_num": i, "status": "busy" if i % 2 else "idle", "unreachable": False,
                              "backend": "local", "price": 0.0, "offer": json.dumps(OFFER), "total_blocks": 16,
                              "busy_blocks": 8 if i % 2 else 0, "created_at": now, "deleted": False,
                              "last_processed_at": now})  # fmt: skip
    async with db.write() as conn:  # type: ignore[attr-defined]
        await conn.execute(sa.insert(t.fleets), fleets)
        await conn.execute(sa.insert(t.instances), instances)
        await conn.execute(sa.update(t.users).values(token_hash=token_hash(TOKEN)))


async def main_async(runs: int, fleets: int, repeats: int) -> None:
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{tmp}/bench.db"
        db = await fresh(url)
        await runs_with_jobs(db, runs, min(100, runs), now)
        await seed_fleets(db, fleets, 4, now)
        settings = Settings(server_dir=Path(tmp), database_url=url, background_processing=False)
        ctx = Context(settings=settings, db=db, computes={})
        app = create_app(ctx, _NoWorkers())
        sid, _user = await ui_sessions.login(db, TOKEN)
        pages = ["/runs", "/runs?status=running", "/runs?status=done", "/projects/main/runs/run-0", "/fleets",
                 "/projects/main/fleets/fleet-0", "/instances", "/projects", "/projects/main", "/users",
                 "/login"]  # fmt: skip
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://bench", cookies={"corral_session": sid}
        ) as c:
            print(f"{runs} runs ({min(100, runs)} running), {fleets} fleets of 4 instances; {repeats} requests a page")
            for path in pages:
                times, cpu, size = [], [], 0
                for k in range(repeats + 2):
                    started, cpu_started = time.perf_counter(), time.process_time()
                    r = await c.get(path)
                    elapsed = (time.perf_counter() - started) * 1000
                    used = (time.process_time() - cpu_started) * 1000
                    assert r.status_code in (200, 303), (path, r.status_code, r.text[:200])
                    if k >= 2:  # the first requests import the UI and compile its templates
                        times.append(elapsed)
                        cpu.append(used)
                    size = len(r.content)
                times.sort()
                p95 = times[int(len(times) * 0.95)]
                print(
                    f"  {path:32s} median {statistics.median(times):5.1f} ms  p95 {p95:5.1f} ms"
                    f"  (CPU median {statistics.median(cpu):5.1f} ms)  {size / 1024:4.0f} KiB"
                )
        await db.dispose()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--fleets", type=int, default=50)
    p.add_argument("--repeats", type=int, default=30)
    a = p.parse_args()
    asyncio.run(main_async(a.runs, a.fleets, a.repeats))


if __name__ == "__main__":
    main()
