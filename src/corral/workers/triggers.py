"""The triggers worker: fires scheduled runs (``schedule``) whose trigger has come.

Load the pending runs that wait for a trigger (one indexed query), decide which are due (pure:
``due_triggers``, ``now`` a parameter), and fire each in a short transaction of its own
(``store/triggers.fire``: compare-and-set on the run's status and trigger time, the jobs inserted in the
same transaction), so that across server replicas a trigger fires once. Then wake the scheduler, and set
one timer for the earliest trigger still to come (every replica sets its own; the one that fires first
wins, the others find nothing to do).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from corral.context import Context
from corral.store import triggers as store

log = logging.getLogger("corral.triggers")


def due_triggers(waiting: Sequence[store.Waiting], now: float) -> tuple[list[store.Waiting], float | None]:
    """The runs whose trigger has come (in trigger order), and the earliest trigger still to come. Pure."""
    due = sorted((w for w in waiting if w.next_triggered_at <= now), key=lambda w: w.next_triggered_at)
    later = [w.next_triggered_at for w in waiting if w.next_triggered_at > now]
    return due, min(later) if later else None


class Triggers:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._timer: asyncio.TimerHandle | None = None

    async def pass_once(self, now: float | None = None) -> int:
        """Fire what is due at ``now`` (default: the wall clock); returns how many triggers this replica fired."""
        async with self.ctx.db.read() as conn:
            waiting = await store.waiting_runs(conn)
        at = time.time() if now is None else now
        due, upcoming = due_triggers(waiting, at)
        fired = 0
        for run in due:
            async with self.ctx.db.write() as conn:
                ok = await store.fire(conn, run.id, run.next_triggered_at, time.time())
            if ok:
                fired += 1
                log.info("run %s: its schedule fired (trigger %s)", run.name, run.next_triggered_at)
        if fired:
            self.ctx.wakeups.wake("scheduler", "runs")
        if upcoming is not None and now is None:
            self._wake_at(upcoming)
        return fired

    def _wake_at(self, when: float) -> None:
        """A pass at ``when`` (wall clock), a little after it (a trigger fires at or after its time)."""
        loop = asyncio.get_running_loop()
        at = loop.time() + max(0.0, when - time.time()) + 0.05
        if self._timer is not None and loop.time() < self._timer.when() <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(at, self.ctx.wakeups.wake_local, "triggers")

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
