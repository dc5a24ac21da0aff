#!/usr/bin/env python3
"""What the start-up sealing pass (``corral.workers.seal_at_rest``) costs: with nothing left in clear
(every start after the first one of an upgrade), and once, over rows an older corral wrote in clear
(which includes the one-time ``VACUUM`` on SQLite).

Fills a fresh SQLite database with N users and M instances (sealed, as corral writes them; all but
``--live`` terminated) and some logs, times the
pass, then writes the same rows in clear and times the pass that seals them. Figures, not assertions.

    python benchmarks/seal_pass.py [--users 500] [--instances 5000] [--live 100] [--logs-mib 50]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import orjson
import sqlalchemy as sa

from corral.server import prepare
from corral.settings import Settings
from corral.store.accounts import token_hash
from corral.store.tables import instances, logs, users
from corral.workers.seal_at_rest import seal_stored_secrets


async def main(n_users: int, n_instances: int, n_live: int, logs_mib: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="corral-seal-bench-"))
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
    project_id = (await _one(ctx, "SELECT id FROM projects")).id
    now = time.time()
    tokens = [str(uuid.uuid4()) for _ in range(n_users)]
    agents = [{"url": "http://127.0.0.1:1", "token": os.urandom(24).hex(), "pid": 1} for _ in range(n_instances)]
    async with ctx.db.write() as conn:
        await conn.execute(
            sa.insert(users),
            [
                {
                    "id": str(uuid.uuid4()),
                    "name": f"u{i}",
                    "token": cipher.encrypt(t),
                    "token_hash": token_hash(t),
                    "global_role": "user",
                    "active": True,
                    "deleted": False,
                    "created_at": now,
                }
                for i, t in enumerate(tokens)
            ],
        )
        await conn.execute(
            sa.insert(instances),
            [
                {
                    "id": str(uuid.uuid4()),
                    "project_id": project_id,
                    "name": f"i{i}",
                    "instance_num": i,
                    "status": "idle" if i < n_live else "terminated",
                    "unreachable": False,
                    "backend": "local",
                    "busy_blocks": 0,
                    "deleted": True,
                    "agent": orjson.dumps({**a, "token": cipher.encrypt(a["token"])}).decode(),
                    "created_at": now,
                    "last_processed_at": now,
                }
                for i, a in enumerate(agents)
            ],
        )
        chunk = os.urandom(1024 * 64)
        await conn.execute(
            sa.insert(logs),
            [{"job_id": "j", "timestamp": now, "source": 0, "message": chunk} for _ in range(logs_mib * 16)],
        )
    times = []
    for _ in range(5):
        started = time.perf_counter()
        assert await seal_stored_secrets(ctx) == 0
        times.append(time.perf_counter() - started)
    print(
        f"nothing to seal ({n_users} users, {n_instances} instances of which {n_live} live, {logs_mib} MiB of logs): "
        f"median {statistics.median(times) * 1000:.1f} ms of 5 passes"
    )
    async with ctx.db.write() as conn:
        for i, t in enumerate(tokens):
            await conn.execute(sa.update(users).where(users.c.name == f"u{i}").values(token=t))
        await conn.execute(sa.update(users).where(users.c.name == "admin").values(token="bench-admin"))
        for i, a in enumerate(agents):
            await conn.execute(
                sa.update(instances).where(instances.c.name == f"i{i}").values(agent=orjson.dumps(a).decode())
            )
    started = time.perf_counter()
    sealed = await seal_stored_secrets(ctx)
    print(f"sealing {sealed} rows in clear, VACUUM included: {(time.perf_counter() - started) * 1000:.0f} ms (once)")
    await ctx.db.dispose()


async def _one(ctx: object, sql: str) -> sa.Row[object]:
    async with ctx.db.read() as conn:  # type: ignore[attr-defined]
        return (await conn.execute(sa.text(sql))).one()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--instances", type=int, default=5000)
    parser.add_argument("--live", type=int, default=100, help="instances not terminated")
    parser.add_argument("--logs-mib", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(main(args.users, args.instances, args.live, args.logs_mib))
