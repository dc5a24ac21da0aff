#!/usr/bin/env python3
"""``GET /metrics`` render time with 1,000 runs: 1,000 runs of one job each (by default 100 of them running,
each with an hour of samples, what the running TTL keeps), rendered by the service behind the
route (the store's reads of current state, then the text). Figures, not assertions.

    python benchmarks/metrics_render.py [--runs 1000] [--running 100] [--samples 1800] [--repeats 30]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.metrics_rows import fresh, runs_with_jobs, samples

from corral.context import Context
from corral.services.prometheus import render_metrics
from corral.settings import Settings
from corral.store import metrics as store


async def main_async(runs: int, running: int, repeats: int, per_job: int) -> None:
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{tmp}/bench.db"
        db = await fresh(url)
        ids = await runs_with_jobs(db, runs, running, now)
        for job_id in ids[:running]:
            async with db.write() as conn:
                await store.add_points(conn, job_id, samples(now - per_job * 2.0, per_job, 2.0))
        ctx = Context(settings=Settings(server_dir=Path(tmp), database_url=url), db=db, computes={})
        for k in range(200):
            ctx.telemetry.observe("corral_queue_wait_seconds", k * 0.7, {"project": "main"})
        times, size = [], 0
        for _ in range(repeats):
            t = time.perf_counter()
            text = await render_metrics(ctx, time.time())
            times.append((time.perf_counter() - t) * 1000)
            size = len(text)
        times.sort()
        print(
            f"{runs} runs ({running} running, {per_job} samples each): /metrics render median "
            f"{statistics.median(times):.1f} ms, p95 {times[int(len(times) * 0.95)]:.1f} ms; "
            f"{size / 1024:.0f} KiB, {text.count(chr(10))} lines"
        )
        await db.dispose()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--running", type=int, default=100)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--samples", type=int, default=1800, help="samples per running job")
    a = p.parse_args()
    asyncio.run(main_async(a.runs, a.running, a.repeats, a.samples))


if __name__ == "__main__":
    main()
