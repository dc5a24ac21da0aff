#!/usr/bin/env python3
"""``GET /metrics`` scrape time with no runs and with 100,000 finished runs (done, failed, terminated; one job
each; two users), rendered by the service behind the route, whose run counts are the kept counts
(``store/run_counts.py``). Beside it, what the run counts cost when they were a ``GROUP BY`` over the runs.
The rows are written straight into a fresh database through the store's table definitions, then counted as
the store counts them. SQLite, or a throwaway Postgres with ``--postgres``. Figures, not assertions.

    python benchmarks/metrics_run_counts.py [--runs 100000] [--repeats 30] [--postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.metrics_rows import fresh

from corral.context import Context
from corral.services.prometheus import render_metrics
from corral.settings import Settings
from corral.store import run_counts
from corral.store import tables as t
from corral.store.db import Database

BATCH = 5000


async def _fill(db: Database, n: int, now: float) -> None:
    async with db.write() as conn:
        await conn.execute(
            sa.insert(t.users),
            {"id": "u2", "name": "second", "token": "y", "token_hash": "h2", "global_role": "user", "created_at": 0.0},
        )
    spec = '{"run_name": "r", "configuration": {"type": "task", "commands": ["train"]}}'
    for start in range(0, n, BATCH):
        run_rows, job_rows = [], []
        for i in range(start, min(n, start + BATCH)):
            status = ("done", "failed", "terminated")[i % 3]
            common = {"project_id": "p", "run_name": f"run-{i}", "submitted_at": now - 3600, "last_processed_at": now}
            run_rows.append(
                {"id": f"r{i}", "user_id": ("u", "u2")[i % 2], "status": status, "run_spec": spec, "deleted": False,
                 **common}
            )  # fmt: skip
            job_rows.append(
                {"id": f"j{i}", "run_id": f"r{i}", "job_num": 0, "replica_num": 0, "job_name": f"run-{i}-0-0",
                 "submission_num": 0, "status": status, "job_spec": "{}", "priority": 0, "blocks": 1, "log_offset": 0,
                 "deployment_num": 0, **common}
            )  # fmt: skip
        async with db.write() as conn:
            await conn.execute(sa.insert(t.runs), run_rows)
            await conn.execute(sa.insert(t.jobs), job_rows)
    async with db.write() as conn:
        await run_counts.recount(conn)


async def _timed(repeats: int, fn: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        await fn()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.95)]


async def _measure(url: str, tmp: str, n: int, repeats: int) -> None:
    db = await fresh(url)
    if n:
        await _fill(db, n, time.time())
    ctx = Context(settings=Settings(server_dir=Path(tmp), database_url=url), db=db, computes={})
    text = await render_metrics(ctx, time.time())
    lines = text.splitlines()
    total = sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("dstack_run_count_total{"))
    if total != n:
        raise SystemExit(f"/metrics counts {total:.0f} runs, not {n}")
    scrape = await _timed(repeats, lambda: render_metrics(ctx, time.time()))
    group_by = sa.select(t.runs.c.project_id, t.runs.c.user_id, t.runs.c.status, sa.func.count()).group_by(
        t.runs.c.project_id, t.runs.c.user_id, t.runs.c.status
    )

    async def recount() -> None:
        async with db.read() as conn:
            await conn.execute(group_by)

    old = await _timed(repeats, recount)
    print(
        f"{n:>7} finished runs: /metrics scrape median {scrape[0]:7.2f} ms, p95 {scrape[1]:7.2f} ms; "
        f"a GROUP BY over the runs (the counts before) median {old[0]:7.2f} ms, p95 {old[1]:7.2f} ms"
    )
    await db.dispose()


async def main_async(runs: int, repeats: int, postgres: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = None
        if postgres:
            from benchlib.postgres import Cluster

            cluster = Cluster()
        try:
            for k, n in enumerate((0, runs)):
                url = cluster.fresh_database(f"bench{k}") if cluster else f"sqlite+aiosqlite:///{tmp}/bench{k}.db"
                await _measure(url, tmp, n, repeats)
        finally:
            if cluster is not None:
                cluster.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--runs", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--postgres", action="store_true", help="a throwaway Postgres cluster instead of SQLite")
    a = p.parse_args()
    asyncio.run(main_async(a.runs, a.repeats, a.postgres))


if __name__ == "__main__":
    main()
