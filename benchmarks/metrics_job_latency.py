#!/usr/bin/env python3
"""``metrics/job`` with a day of samples for 50 jobs: the read of one job's series (the store's indexed range
plus dstack's series computation, what the route does after authorising), for ``limit`` 1 (dstack's
default), 100 and 1000 (its CLI), and an ``after`` window of the last hour. Figures, not assertions.

    python benchmarks/metrics_job_latency.py [--jobs 50] [--hours 24] [--interval 2] [--repeats 200]
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

from corral.domain.metrics import JobResources, job_series
from corral.store import metrics as store


async def main_async(jobs: int, hours: float, interval: float, repeats: int) -> None:
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        db = await fresh(f"sqlite+aiosqlite:///{tmp}/bench.db")
        ids = await runs_with_jobs(db, jobs, jobs, now)
        per_job = int(hours * 3600 / interval)
        t0 = time.perf_counter()
        for job_id in ids:
            async with db.write() as conn:
                await store.add_points(conn, job_id, samples(now - hours * 3600, per_job, interval))
        print(
            f"rows: {jobs} jobs x {per_job} samples = {jobs * per_job:,} (written in {time.perf_counter() - t0:.0f} s)"
        )
        res = JobResources(16, 128 * 2**30, 143771 * 2**20)
        cases = [("limit=1", 1, None), ("limit=100", 100, None), ("limit=1000", 1000, None)]
        cases.append(("after=1h ago (1800 samples)", None, int((now - 3600) * 1_000_000)))
        for label, limit, after in cases:
            times = []
            for k in range(repeats):
                job_id = ids[k % len(ids)]
                t = time.perf_counter()
                async with db.read() as conn:
                    points = await store.job_points(conn, job_id, None if limit is None else limit + 1, after)
                job_series(points, res)
                times.append((time.perf_counter() - t) * 1000)
            times.sort()
            print(
                f"{label:28s} median {statistics.median(times):7.2f} ms  p95 {times[int(len(times) * 0.95)]:7.2f} ms"
                f"  ({len(points)} points read)"
            )
        await db.dispose()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=50)
    p.add_argument("--hours", type=float, default=24)
    p.add_argument("--interval", type=float, default=2.0)
    p.add_argument("--repeats", type=int, default=200)
    a = p.parse_args()
    asyncio.run(main_async(a.jobs, a.hours, a.interval, a.repeats))


if __name__ == "__main__":
    main()
