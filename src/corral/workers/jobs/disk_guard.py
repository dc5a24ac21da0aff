"""The free-space watermark as the jobs' followers see it: while the state directory has less free than
``CORRAL_MIN_FREE_DISK_MB``, a job's output is left on its agent (not stored, its offset kept) and stored when
space returns, and the job's status message says so; a job that ends meanwhile is recorded with a line saying
from where its output was not stored. Each change of state is one line in the server's log.

May import: corral.diskspace, corral.settings, corral.domain.
"""

from __future__ import annotations

import logging
from pathlib import Path

from corral import diskspace
from corral.domain.records import AGENT_LOG_SOURCE

log = logging.getLogger("corral.jobs")

#: A running job's status message while its output waits on its agent (``runs/get``, ``corral ps``).
PAUSED = "running; output not stored for now: the server's disk is below CORRAL_MIN_FREE_DISK_MB"


class DiskGuard:
    """Whether output may be stored now (one per follower: it logs when its job's output pauses and resumes)."""

    def __init__(self, state_dir: Path, watermark: int) -> None:
        self.state_dir = state_dir
        self.watermark = watermark
        self.paused = False
        #: Whether the last :meth:`low` changed ``paused``.
        self.changed = False

    def low(self, job_name: str) -> bool:
        """Whether the state directory is below the watermark now (logged when that changes)."""
        below = bool(self.watermark) and diskspace.below_watermark(self.state_dir, self.watermark) is not None
        if below and not self.paused:
            log.warning(
                "output of %s is not stored for now: %s",
                job_name,
                diskspace.refusal(self.state_dir, self.watermark),
                extra={"event": "disk_low"},
            )
        elif self.paused and not below:
            log.info("output of %s is stored again: space returned", job_name, extra={"event": "disk_ok"})
        self.changed = below != self.paused
        self.paused = below
        return below


def dropped_note(offset: int, now: float, state_dir: Path) -> tuple[float, int, bytes]:
    """The agent line stored, in place of a job's output from its agent's entry ``offset`` on, when the job
    ended while that output could not be stored."""
    msg = (
        f"this job's output from its entry {offset} on was not stored: the server's state directory {state_dir} "
        "was below its free-space watermark (CORRAL_MIN_FREE_DISK_MB) when the job ended\n"
    )
    return (now, AGENT_LOG_SOURCE, msg.encode())
