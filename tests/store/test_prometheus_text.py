"""``GET /metrics``' whole text for a state whose names need escaping (quotes, backslashes, newlines, a name
beyond ASCII), on SQLite and on Postgres: the series, labels, help texts and values are dstack 0.22.5's and must
not change by one byte when the rendering gets faster. ``EXPECTED`` (``tests/data/prometheus/escaped_names.txt``)
is the text the rendering wrote before it kept label blocks and read the counts by SQLite's driver; it holds on
every scrape (the second one reads what the first kept)."""

from __future__ import annotations

from pathlib import Path

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.context import Context
from corral.services.prometheus import render_metrics
from corral.settings import Settings
from corral.store import tables as t
from corral.store.db import Database
from corral.store.migrate import upgrade

NOW = 5000.25
PROJECTS = {"p": "main", "q": 'q"uo\\te\nx'}
USERS = {"u": "admin", "v": "a\\b", "w": 'new\nline "quoted"', "x": "jürgen"}
#: (project, user, status) -> runs; a zero count has no series, a pair whose runs are all running has zeros
COUNTS = [
    ("p", "u", "done", 5), ("p", "u", "failed", 0), ("p", "u", "terminated", 2), ("p", "v", "running", 3),
    ("q", "w", "failed", 7), ("q", "w", "done", 2**31 - 1), ("q", "x", "terminated", 1), ("q", "u", "failed", 0),
]  # fmt: skip
GPU_OFFER = {"instance_type": {"name": "p4d", "resources": {"gpus": [{"name": 'A"100', "memory_mib": 81920}]}}}
PROVISIONING = {
    "backend": "aws", "price": 2.5, "instance_type": {"name": "p4d", "resources": {
        "gpus": [{"name": "A100", "memory_mib": 81920}, {"name": "A100", "memory_mib": 81920}],
        "cpus": 8, "memory_mib": 65536}},
}  # fmt: skip

#: the text the rendering wrote before it got faster
EXPECTED = (Path(__file__).parent.parent / "data" / "prometheus" / "escaped_names.txt").read_text()


async def _state(db: Database) -> None:
    async with db.write() as conn:
        for uid, name in USERS.items():
            await conn.execute(
                sa.insert(t.users).values(
                    id=uid, name=name, token=uid, token_hash=uid, global_role="admin", active=True, deleted=False,
                    created_at=0.0,
                )
            )  # fmt: skip
        for pid, name in PROJECTS.items():
            await conn.execute(
                sa.insert(t.projects).values(
                    id=pid, name=name, owner_id="u", created_at=0.0, is_public=False, deleted=False, backends="[]"
                )
            )
        await conn.execute(
            sa.insert(t.run_counts), [{"project_id": p, "user_id": u, "status": s, "count": n} for p, u, s, n in COUNTS]
        )
        await conn.execute(
            sa.insert(t.run_pending_counts),
            [
                {"project_id": "q", "run_type": "service", "count": 2},
                {"project_id": "p", "run_type": "task", "count": 1},
            ],
        )
        await _instances_and_jobs(conn)


async def _instances_and_jobs(conn: AsyncConnection) -> None:
    await conn.execute(
        sa.insert(t.fleets).values(
            id="f", project_id="q", name="back\\slash", created_at=0.0, last_processed_at=0.0, status="active",
            spec="{}", deleted=False,
        )
    )  # fmt: skip
    for iid, project, fleet, backend, offer, price in (
        ("i1", "q", "f", "aws", orjson.dumps(GPU_OFFER).decode(), 12.34),
        ("i2", "p", None, "local", orjson.dumps({"resources": {"cpus": 2}}).decode(), None),
        ("i3", "p", None, "ssh", None, 0.1),
    ):
        await conn.execute(
            sa.insert(t.instances).values(
                id=iid, project_id=project, fleet_id=fleet, name=f'{iid}"n', instance_num=0, status="busy",
                unreachable=False, backend=backend, busy_blocks=1, created_at=1000.5, last_processed_at=0.0,
                deleted=False, offer=offer, price=price,
            )
        )  # fmt: skip
    spec = orjson.dumps({"configuration": {"type": "task"}}).decode()
    for rid, user, status in (("r1", "w", "running"), ("r2", "u", "submitted")):
        await conn.execute(
            sa.insert(t.runs).values(
                id=rid, project_id="q", user_id=user, run_name=f"{rid}\\x", submitted_at=10.0, last_processed_at=10.0,
                status=status, run_spec=spec, priority=0, deployment_num=0, deleted=False,
            )
        )  # fmt: skip
    for jid, rid, status, provisioning in (
        ("j1", "r1", "running", orjson.dumps(PROVISIONING).decode()),
        ("j2", "r1", "running", None),  # no provisioning data: no series
        ("j3", "r2", "submitted", None),  # in the queue
    ):
        await conn.execute(
            sa.insert(t.jobs).values(
                id=jid, run_id=rid, project_id="q", run_name=f"{rid}\\x", job_num=0, replica_num=int(jid[1]),
                job_name=f"{jid}-0", submission_num=0, deployment_num=0, submitted_at=1234.125, last_processed_at=0.0,
                status=status, job_spec="{}", priority=0, blocks=1, log_offset=0, job_provisioning_data=provisioning,
            )
        )  # fmt: skip
    await conn.execute(
        sa.insert(t.job_metrics_points).values(
            job_id="j1", timestamp_micro=1, cpu_usage_micro=2_500_001, memory_usage_bytes=3 * 2**30,
            memory_working_set_bytes=2**30, gpus=orjson.dumps([[1024, 50], [2048, 100]]).decode(),
        )
    )  # fmt: skip


async def test_the_metrics_text_is_byte_for_byte_what_it_was(db_url: str, tmp_path: Path) -> None:
    db = Database(db_url)
    await upgrade(db)
    await _state(db)
    ctx = Context(Settings(server_dir=tmp_path, database_url=db_url), db, {})
    ctx.telemetry.inc("corral_proxy_requests_total", {"project": 'q"', "run": "a\\b\nc", "code": "200"})
    try:
        first = await render_metrics(ctx, NOW)
        assert first == EXPECTED
        assert await render_metrics(ctx, NOW) == EXPECTED
    finally:
        await db.dispose()
