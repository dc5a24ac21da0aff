"""Job metrics samples (``job_metrics_points``): write what agents report, read a job's latest samples, the
latest sample of each of some jobs, recent GPU utilisation, and delete expired samples in batches.

Every read is an indexed range of one job's samples (``job_id, timestamp_micro``), newest first, bounded by
``limit``: reading never scans history, however long it is. Retention (``delete_expired``) is dstack's: a
live job's samples older than the running TTL go, any other job's older than the finished TTL (so a
finished job keeps about its last running-TTL of samples for the finished TTL).

Imports ``domain`` and sqlalchemy only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.metrics import LIVE_STATUSES, MetricsPoint
from corral.store.tables import job_metrics_points, jobs

#: Rows one ``delete_expired`` call removes at most (a short write; a full batch means more are due).
EXPIRED_BATCH = 5000
_P = job_metrics_points


def _pack(point: MetricsPoint) -> str | None:
    if not point.gpus_memory_usage_bytes and not point.gpus_util_percent:
        return None
    return json.dumps([list(g) for g in zip(point.gpus_memory_usage_bytes, point.gpus_util_percent, strict=True)])


def _point(row: Any) -> MetricsPoint:
    gpus: list[list[int]] = json.loads(row[4]) if row[4] else []
    return MetricsPoint(
        timestamp_micro=int(row[0]),
        cpu_usage_micro=int(row[1]),
        memory_usage_bytes=int(row[2]),
        memory_working_set_bytes=int(row[3]),
        gpus_memory_usage_bytes=tuple(int(g[0]) for g in gpus),
        gpus_util_percent=tuple(int(g[1]) for g in gpus),
    )


_COLUMNS = (
    _P.c.timestamp_micro,
    _P.c.cpu_usage_micro,
    _P.c.memory_usage_bytes,
    _P.c.memory_working_set_bytes,
    _P.c.gpus,
)


async def last_timestamp(conn: AsyncConnection, job_id: str) -> int:
    """The newest stored sample's timestamp (µs) of the job, 0 if none."""
    found = await conn.scalar(
        sa.select(_P.c.timestamp_micro).where(_P.c.job_id == job_id).order_by(_P.c.timestamp_micro.desc()).limit(1)
    )
    return int(found or 0)


async def add_points(conn: AsyncConnection, job_id: str, points: Sequence[MetricsPoint]) -> int:
    """Store the samples newer than the job's newest stored one (a sample is never stored twice); returns
    how many were stored."""
    if not points:
        return 0
    newest = await last_timestamp(conn, job_id)
    fresh: dict[int, MetricsPoint] = {p.timestamp_micro: p for p in points if p.timestamp_micro > newest}
    if not fresh:
        return 0
    await conn.execute(
        sa.insert(_P),
        [
            {
                "job_id": job_id,
                "timestamp_micro": p.timestamp_micro,
                "cpu_usage_micro": p.cpu_usage_micro,
                "memory_usage_bytes": p.memory_usage_bytes,
                "memory_working_set_bytes": p.memory_working_set_bytes,
                "gpus": _pack(p),
            }
            for p in sorted(fresh.values(), key=lambda p: p.timestamp_micro)
        ],
    )
    return len(fresh)


async def job_points(
    conn: AsyncConnection,
    job_id: str,
    limit: int | None,
    after_micro: int | None = None,
    before_micro: int | None = None,
) -> list[MetricsPoint]:
    """The job's samples, newest first: at most ``limit`` (None: all in the window), taken at or after
    ``after_micro`` and before ``before_micro``."""
    q = sa.select(*_COLUMNS).where(_P.c.job_id == job_id)
    if after_micro is not None:
        q = q.where(_P.c.timestamp_micro >= after_micro)
    if before_micro is not None:
        q = q.where(_P.c.timestamp_micro < before_micro)
    q = q.order_by(_P.c.timestamp_micro.desc())
    if limit is not None:
        q = q.limit(limit)
    return [_point(r) for r in await conn.execute(q)]


async def latest_points(conn: AsyncConnection, job_ids: Sequence[str]) -> dict[str, MetricsPoint]:
    """The newest sample of each job (those with one): one query, an index seek per job."""
    out: dict[str, MetricsPoint] = {}
    ids = list(dict.fromkeys(job_ids))
    for start in range(0, len(ids), 500):
        newest = (
            sa.select(_P.c.id)
            .where(_P.c.job_id == jobs.c.id)
            .order_by(_P.c.timestamp_micro.desc())
            .limit(1)
            .correlate(jobs)
            .scalar_subquery()
        )
        wanted = sa.select(newest).where(jobs.c.id.in_(ids[start : start + 500]))
        for row in await conn.execute(sa.select(_P.c.job_id, *_COLUMNS).where(_P.c.id.in_(wanted))):
            out[row[0]] = _point(row[1:])
    return out


async def recent_gpu_utilization(
    conn: AsyncConnection, job_id: str, since_micro: int
) -> list[tuple[int, tuple[int, ...]]]:
    """The job's GPU utilisation samples (percent per GPU, in the order of its devices) taken at or after
    ``since_micro``, newest first: ``[(timestamp_micro, (util_gpu0, util_gpu1, ...)), ...]``. A sample
    without GPU values (the tool failed, or the job has no GPU) is left out. For ``utilization_policy``:
    e.g. ``recent_gpu_utilization(conn, job.id, now_micro - time_window)``; an indexed range of one job."""
    points = await job_points(conn, job_id, None, after_micro=since_micro)
    return [(p.timestamp_micro, p.gpus_util_percent) for p in points if p.gpus_util_percent]


async def delete_expired(
    conn: AsyncConnection, running_before: int, finished_before: int, batch: int = EXPIRED_BATCH
) -> int:
    """Delete up to ``batch`` expired samples: a live job's taken before ``running_before``, any other
    job's before ``finished_before`` (µs). Returns how many went."""
    live = sa.select(jobs.c.id).where(jobs.c.status.in_(LIVE_STATUSES))
    ids = list(
        (
            await conn.execute(
                sa.select(_P.c.id)
                .where(_P.c.timestamp_micro < finished_before, _P.c.job_id.not_in(live))
                .order_by(_P.c.timestamp_micro)
                .limit(batch)
            )
        ).scalars()
    )
    if len(ids) < batch:
        ids += list(
            (
                await conn.execute(
                    sa.select(_P.c.id)
                    .where(_P.c.job_id.in_(live), _P.c.timestamp_micro < running_before)
                    .limit(batch - len(ids))
                )
            ).scalars()
        )
    if not ids:
        return 0
    await conn.execute(sa.delete(_P).where(_P.c.id.in_(ids)))
    return len(ids)
