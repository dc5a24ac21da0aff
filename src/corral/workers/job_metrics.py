"""What the jobs worker stores of the resource samples that come with a job's output (``LogsReply.metrics``):
the samples as :class:`~corral.domain.metrics.MetricsPoint` rows, and where the next poll continues.

Samples ride on the follower's long poll of the job's output (no round trip of their own); a bad sample was
already dropped by the protocol and is logged here, once per reply.
"""

from __future__ import annotations

import logging

from corral.agent.protocol import LogsReply
from corral.domain.metrics import MetricsPoint
from corral.store import metrics as metrics_store
from corral.store.db import Connection

log = logging.getLogger("corral.jobs")


def points_of(reply: LogsReply, job_name: str) -> list[MetricsPoint]:
    if reply.metrics_rejected:
        log.warning(
            "%s: %d resource sample(s) from the agent dropped: %s",
            job_name,
            len(reply.metrics_rejected),
            reply.metrics_rejected[0],
        )
    return [
        MetricsPoint(
            timestamp_micro=s.timestamp_micro,
            cpu_usage_micro=s.cpu_usage_micro,
            memory_usage_bytes=s.memory_usage_bytes,
            memory_working_set_bytes=s.memory_working_set_bytes,
            gpus_memory_usage_bytes=tuple(g.gpu_memory_usage_bytes for g in s.gpus),
            gpus_util_percent=tuple(g.gpu_util_percent for g in s.gpus),
        )
        for s in reply.metrics
    ]


async def store(conn: Connection, job_id: str, points: list[MetricsPoint], cursor: int) -> int:
    """Store the samples (in the caller's transaction); returns the cursor of the next poll."""
    if not points:
        return cursor
    await metrics_store.add_points(conn, job_id, points)
    return max(cursor, max(p.timestamp_micro for p in points))
