"""Job metrics samples in the store (SQLite and Postgres): stored once each, read newest first within a
window, the GPU values unpacked, and deleted by dstack's retention (running and finished TTLs) in batches."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from corral.context import Context
from corral.domain.metrics import MetricsPoint, retention_cutoffs
from corral.settings import Settings
from corral.store import metrics as m
from corral.store import tables as t
from corral.store.db import Database
from corral.store.migrate import upgrade
from corral.workers.metrics_retention import MetricsRetention

S = 1_000_000  # µs


async def _jobs(db: Database, statuses: dict[str, str]) -> None:
    async with db.write() as conn:
        await conn.execute(
            sa.insert(t.users),
            {"id": "u", "name": "u", "token": "x", "token_hash": "h", "global_role": "admin", "created_at": 0.0},
        )
        await conn.execute(sa.insert(t.projects), {"id": "p", "name": "p", "owner_id": "u", "created_at": 0.0})
        await conn.execute(
            sa.insert(t.runs),
            {
                "id": "r", "project_id": "p", "user_id": "u", "run_name": "r", "submitted_at": 0.0,
                "last_processed_at": 0.0, "status": "running", "run_spec": "{}",
            },
        )  # fmt: skip
        for n, (job_id, status) in enumerate(statuses.items()):
            await conn.execute(
                sa.insert(t.jobs),
                {
                    "id": job_id, "run_id": "r", "project_id": "p", "run_name": "r", "job_num": n,
                    "job_name": f"r-0-{n}", "submitted_at": 0.0, "last_processed_at": 0.0, "status": status,
                    "job_spec": "{}",
                },
            )  # fmt: skip


def _p(ts: int, cpu: int = 0, gpus: tuple[tuple[int, int], ...] = ()) -> MetricsPoint:
    return MetricsPoint(ts, cpu, 100 + ts, 50 + ts, tuple(g[0] for g in gpus), tuple(g[1] for g in gpus))


async def test_samples_are_stored_once_and_read_newest_first(db_url: str) -> None:
    db = Database(db_url)
    await upgrade(db)
    await _jobs(db, {"j": "running", "quiet": "running"})
    async with db.write() as conn:
        assert await m.add_points(conn, "j", [_p(1 * S, gpus=((2**30, 40), (0, 100))), _p(2 * S), _p(3 * S)]) == 3
        assert await m.add_points(conn, "j", [_p(2 * S), _p(3 * S), _p(4 * S)]) == 1  # a poll seen twice
    async with db.read() as conn:
        assert [p.timestamp_micro for p in await m.job_points(conn, "j", None)] == [4 * S, 3 * S, 2 * S, 1 * S]
        assert [p.timestamp_micro for p in await m.job_points(conn, "j", 2)] == [4 * S, 3 * S]
        window = await m.job_points(conn, "j", None, after_micro=2 * S, before_micro=4 * S)
        assert [p.timestamp_micro for p in window] == [3 * S, 2 * S]
        oldest = (await m.job_points(conn, "j", None))[-1]
        assert (oldest.gpus_memory_usage_bytes, oldest.gpus_util_percent) == ((2**30, 0), (40, 100))
        assert await m.recent_gpu_utilization(conn, "j", 0) == [(1 * S, (40, 100))]
        assert await m.last_timestamp(conn, "j") == 4 * S and await m.last_timestamp(conn, "none") == 0
        latest = await m.latest_points(conn, ["j", "quiet", "none"])  # "quiet": no sample yet
        assert list(latest) == ["j"] and latest["j"].timestamp_micro == 4 * S
    await db.dispose()


async def test_retention_follows_the_running_and_finished_ttls_in_batches(db_url: str, tmp_path: Path) -> None:
    db = Database(db_url)
    await upgrade(db)
    await _jobs(db, {"live": "running", "done": "done"})
    now = 100_000.0
    async with db.write() as conn:
        for job_id in ("live", "done", "gone"):  # "gone": its job row no longer exists
            points = [_p(int((now - age) * S)) for age in (10.0, 5000.0, 90_000.0)]
            await m.add_points(conn, job_id, points)
    settings = Settings(
        server_dir=tmp_path, database_url=db_url, metrics_running_ttl=3600.0, metrics_finished_ttl=86_400.0
    )
    running, finished = retention_cutoffs(now, settings.metrics_running_ttl, settings.metrics_finished_ttl)
    async with db.write() as conn:
        assert await m.delete_expired(conn, running, finished, batch=2) == 2  # a batch at most
    worker = MetricsRetention(Context(settings=settings, db=db, computes={}), batch=2)
    deleted = 2 + await worker.pass_once(now)  # the worker: batch after batch until none is due
    assert deleted == 1 + 1 + 1 + 1  # live: the 5000 s and 90000 s ones; done and gone: the 90000 s one each
    async with db.read() as conn:
        ages = {
            j: [round(now - p.timestamp_micro / S) for p in await m.job_points(conn, j, None)]
            for j in ("live", "done", "gone")
        }
    assert ages == {"live": [10], "done": [10, 5000], "gone": [10, 5000]}
    await db.dispose()
