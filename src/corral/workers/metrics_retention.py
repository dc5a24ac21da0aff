"""The retention worker of job metrics samples: every ``INTERVAL`` seconds it deletes the expired ones
(dstack's running and finished TTLs, ``Settings.metrics_running_ttl`` / ``metrics_finished_ttl``), a
bounded batch per short transaction until none is left.

Imports ``domain``, ``store`` and the workers' context.
"""

from __future__ import annotations

import asyncio
import logging
import time

from corral.context import Context
from corral.domain.metrics import retention_cutoffs
from corral.store import metrics as metrics_store

log = logging.getLogger("corral.workers")

#: Seconds between two clean-ups (dstack: 5 minutes).
INTERVAL = 60.0
#: The most batches one clean-up deletes (the rest waits for the next one, so the loop never hogs the database).
MAX_BATCHES = 20


class MetricsRetention:
    def __init__(self, ctx: Context, batch: int = metrics_store.EXPIRED_BATCH) -> None:
        self.ctx = ctx
        self.batch = batch
        self._stopping = asyncio.Event()

    async def pass_once(self, now: float | None = None) -> int:
        """Delete expired samples now; returns how many went."""
        s = self.ctx.settings
        running, finished = retention_cutoffs(
            time.time() if now is None else now, s.metrics_running_ttl, s.metrics_finished_ttl
        )
        total = 0
        for _ in range(MAX_BATCHES):
            async with self.ctx.db.write() as conn:
                deleted = await metrics_store.delete_expired(conn, running, finished, self.batch)
            total += deleted
            if deleted < self.batch:
                break
        return total

    async def run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.pass_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if not self.ctx.lacked_space("the metrics retention pass", e):
                    log.exception("deleting expired job metrics failed")
            else:
                self.ctx.went_through("the metrics retention pass")
            try:
                await asyncio.wait_for(self._stopping.wait(), INTERVAL)
            except asyncio.TimeoutError:
                pass

    def stop(self) -> None:
        self._stopping.set()
