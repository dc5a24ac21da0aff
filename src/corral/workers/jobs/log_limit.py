"""The per-job limit on stored output (``CORRAL_JOB_LOG_LIMIT_MB``), as a job's follower applies it: once a
job's stored output passes the limit, its oldest entries are dropped down to three quarters of it (the newest
are kept), and one agent line (``logs/poll`` with ``diagnose``) and one line in the server's log say how much.

May import: corral.store, corral.domain.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from corral.domain.records import AGENT_LOG_SOURCE
from corral.store import log_limits
from corral.store import runs as run_store
from corral.store.db import Connection

log = logging.getLogger("corral.jobs")


class LogLimit:
    """One job's stored output, counted as it is appended (read from the database once)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.stored: int | None = None

    async def appended(
        self, conn: Connection, job_id: str, job_name: str, entries: Sequence[tuple[float, int, bytes]]
    ) -> None:
        """``entries`` were just stored for the job (in ``conn``'s transaction): trim its oldest if past the limit."""
        if not self.limit or not entries:
            return
        if self.stored is None:
            self.stored = await log_limits.stored_bytes(conn, job_id)
        else:
            self.stored += sum(len(m) for _, _, m in entries)
        if self.stored <= self.limit:
            return
        t = await log_limits.trim(conn, job_id, self.limit * 3 // 4)
        note = (
            f"{t.entries} entries ({t.size} bytes) of this job's oldest output were dropped: a job keeps its newest "
            f"{self.limit // 2**20} MiB of output (CORRAL_JOB_LOG_LIMIT_MB)\n"
        ).encode()
        await run_store.append_logs(conn, job_id, [(entries[-1][0], AGENT_LOG_SOURCE, note)])
        self.stored = t.kept + len(note)
        log.info(
            "dropped the oldest %d bytes of %s's output (its limit)", t.size, job_name, extra={"event": "log_limit"}
        )
