#!/usr/bin/env python3
"""Why the registry-password sealing pass (``corral.workers.seal_run_specs``) runs once per database: what
it costs a start with N stored runs (each with a job, a realistic spec of a few KiB, a tenth of them with
``registry_auth``) when it has to look (no ``server_state`` marker: every spec holding ``registry_auth`` is
read and parsed) and when the marker says it ran (one row read). SQLite, everything already sealed.
Figures, not assertions.

    python benchmarks/seal_run_specs.py [--runs 20000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import orjson
import sqlalchemy as sa

from corral.server import prepare
from corral.settings import Settings
from corral.store.tables import jobs, runs, server_state
from corral.workers.seal_run_specs import MARKER, seal_run_specs


async def main(n_runs: int, repeats: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="corral-seal-specs-bench-"))
    settings = Settings(
        server_dir=tmp / "server",
        database_url=f"sqlite+aiosqlite:///{tmp / 'server' / 'data' / 'corral.db'}",
        admin_token="bench-admin",
        write_cli_config=False,
        background_processing=False,
    )
    prepared = await prepare(settings)
    ctx = prepared.ctx
    cipher = ctx.cipher()
    async with ctx.db.read() as conn:
        project_id = (await conn.execute(sa.text("SELECT id FROM projects"))).scalar_one()
        user_id = (await conn.execute(sa.text("SELECT id FROM users"))).scalar_one()
    now = time.time()
    filler = {
        "commands": [f"python step_{i}.py --flag {i}" for i in range(30)],
        "env": {f"K{i}": "v" * 20 for i in range(30)},
    }
    run_rows, job_rows = [], []
    for i in range(n_runs):
        auth = {"username": "u", "password": cipher.encrypt("p")} if i % 10 == 0 else None
        conf = {"type": "task", "registry_auth": auth, **filler}
        rid = str(uuid.uuid4())
        common = {"project_id": project_id, "run_name": f"r{i}", "submitted_at": now, "last_processed_at": now}
        run_rows.append(
            {
                "id": rid,
                "user_id": user_id,
                "status": "done",
                "deleted": False,
                "priority": 0,
                "deployment_num": 0,
                "run_spec": orjson.dumps({"configuration": conf}).decode(),
                **common,
            }
        )
        job_rows.append(
            {
                "id": str(uuid.uuid4()),
                "run_id": rid,
                "job_num": 0,
                "replica_num": 0,
                "job_name": f"r{i}-0-0",
                "submission_num": 0,
                "deployment_num": 0,
                "status": "done",
                "priority": 0,
                "blocks": 1,
                "log_offset": 0,
                "job_spec": orjson.dumps({"registry_auth": auth, **filler}).decode(),
                **common,
            }
        )
    async with ctx.db.write() as conn:
        for k in range(0, n_runs, 1000):
            await conn.execute(sa.insert(runs), run_rows[k : k + 1000])
            await conn.execute(sa.insert(jobs), job_rows[k : k + 1000])
    size = sum(len(r["run_spec"]) + len(j["job_spec"]) for r, j in zip(run_rows, job_rows, strict=True))
    looking, marked = [], []
    for _ in range(repeats):
        async with ctx.db.write() as conn:
            await conn.execute(sa.delete(server_state).where(server_state.c.key == MARKER))
        t0 = time.perf_counter()
        assert await seal_run_specs(ctx) == 0
        looking.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        assert await seal_run_specs(ctx) is None
        marked.append(time.perf_counter() - t0)
    print(f"{n_runs} runs and jobs ({size / 2**20:.0f} MiB of specs), median of {repeats}:")
    print(f"  without the marker (scan, parse)  {statistics.median(looking) * 1000:8.1f} ms")
    print(f"  with the marker (one row)         {statistics.median(marked) * 1000:8.1f} ms")
    await ctx.db.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.repeats))
