"""A running job's ``utilization_policy``, checked by the job's follower (:mod:`corral.workers.jobs.follower`) at
most every :data:`CHECK_EVERY_S`: its GPU utilisation samples of the last ``time_window``
(``store.metrics.recent_gpu_utilization``, one job's indexed range) judged by dstack's rule
(:mod:`corral.domain.utilization`). A job that stayed under the policy is asked to stop -- as a dev
environment past its ``inactivity_duration`` is -- and ends ``terminated`` with
``terminated_due_to_utilization_policy`` and dstack's message (:mod:`corral.workers.jobs.outcomes`).

May import: corral.domain, corral.store (metrics, runs), corral.context.
"""

from __future__ import annotations

import logging
from typing import Any

from corral.context import Context
from corral.domain import utilization
from corral.domain.records import JobRec
from corral.store import metrics as metrics_store
from corral.store import runs as run_store

log = logging.getLogger("corral.jobs")

#: How often a job's follower looks at its utilisation (dstack: each pass of its running-jobs task).
CHECK_EVERY_S = 20.0
STOP = "utilization"


def check_every(policy: tuple[int, float] | None) -> float:
    """How often a job's utilisation is looked at: every :data:`CHECK_EVERY_S`, or four times per window for a
    window shorter than that allows (``CORRAL_UTILIZATION_MIN_WINDOW``, for checks)."""
    if policy is None:
        return CHECK_EVERY_S
    return max(0.5, min(CHECK_EVERY_S, policy[1] / 4))


def policy_of(job: JobRec) -> tuple[int, float] | None:
    """The job's ``(min_gpu_utilization, time_window)`` (None: no policy)."""
    raw: Any = job.job_spec.get("utilization_policy")
    if not isinstance(raw, dict):
        return None
    try:
        return int(raw["min_gpu_utilization"]), float(raw["time_window"])
    except (KeyError, TypeError, ValueError):
        return None


async def stop_if_underused(ctx: Context, job: JobRec, policy: tuple[int, float], now: float) -> bool:
    """Ask the job to stop when its GPUs stayed under the policy for its window; whether it was asked."""
    min_util, window = policy
    async with ctx.db.read() as conn:
        samples = await metrics_store.recent_gpu_utilization(conn, job.id, int((now - window) * 1_000_000))
    judged = [(ts / 1_000_000, utils) for ts, utils in samples]
    if not utilization.low_utilization(min_util, window, now, judged):
        return False
    message = utilization.message(min_util, window)
    log.info("%s: %s; stopping it (utilization_policy)", job.job_name, message)
    async with ctx.db.write() as conn:
        return await run_store.update_job(
            conn, job.id, {"stop_requested": STOP, "termination_reason_message": message}, expect_status=("running",)
        )
