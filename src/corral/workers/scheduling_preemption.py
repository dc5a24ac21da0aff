"""Preemption in the scheduling pass, when ``scheduling.preemption.enabled``: load the jobs holding capacity,
decide (pure ``scheduler.preemption.choose`` on the pass's snapshot and plan), then ask the victims to stop
in one short transaction that skips any gang asked to stop meanwhile. The jobs worker sends the stop to the
agent with the grace period (SIGTERM, a file naming the deadline, SIGKILL at the deadline); the runs worker
requeues the preempted task whatever its ``retry`` (``workers.runs``). Once the victims have ended, the
capacity they freed is held for the preemptor (``holds``, ``scheduler.holds``). A pass whose snapshot is
older than a job's end (another replica's worker, say, released an instance meanwhile) decides nothing and
asks for a new pass: on the stale snapshot the freed capacity would look taken."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from corral.context import Context
from corral.domain.quotas import QuotaPolicy
from corral.scheduler.holds import HOLD_FOR, holds_for
from corral.scheduler.preemption import Settings, choose
from corral.scheduler.preemption_room import freed_since
from corral.scheduler.schedule import schedule
from corral.scheduler.types import Hold, Plan, QueuedJob, Snapshot
from corral.store import preemption as store

log = logging.getLogger("corral.scheduler")


def settings_of(block: Any) -> Settings:
    """The scheduler's value of ``config.yml``'s ``scheduling.preemption`` (``config.quotas.Preemption``)."""
    return Settings(
        enabled=bool(block.enabled),
        min_priority_gap=int(block.min_priority_gap),
        min_runtime=float(block.min_runtime),
        grace_period=float(block.grace_period),
        max_victims_per_cycle=int(block.max_victims_per_cycle),
    )


class Preempter:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        #: run id -> its configuration type, read once per run.
        self._run_types: dict[str, str] = {}

    async def holds(self, queued: Sequence[QueuedJob], now: float) -> tuple[Hold, ...]:
        """The capacity held for waiting runs that preempted (read from the victims' stop records)."""
        if not self.ctx.preemption.enabled or not queued:
            return ()
        async with self.ctx.db.read() as conn:
            ended = await store.ended_victims(conn, now - HOLD_FOR)
        return holds_for(ended, queued, now)

    async def pass_once(self, snapshot: Snapshot, plan: Plan, policies: dict[str, QuotaPolicy], now: float) -> int:
        """Stop what the waiting runs of ``plan`` may take the place of; the number of gangs stopped."""
        settings = self.ctx.preemption
        if not settings.enabled or not snapshot.queue:
            return 0
        if not any(p.preemptible_max_priority is not None for p in policies.values()):
            return 0  # nothing is preemptible
        async with self.ctx.db.read() as conn:
            running, types = await store.holding_jobs(conn, self._run_types)
            busy_now = await store.busy_blocks(conn)  # after the jobs: what ended meanwhile shows here
        live = {j.run_id for j in running}
        self._run_types = {k: v for k, v in {**self._run_types, **types}.items() if k in live}
        chosen = choose(snapshot, plan, running, policies, settings, now, schedule)
        if not chosen:
            return 0
        if freed_since(snapshot, busy_now):
            # a job ended after the snapshot: its capacity, free or held for its preemptor, is not in the
            # snapshot, where it looks taken and a waiting run may preempt for it: decide on a fresh one
            self.ctx.wakeups.wake("scheduler")
            return 0
        async with self.ctx.db.write() as conn:
            done = await store.stop_victims(conn, chosen, now)
        for p in done:
            log.info(
                "run %s preempted by run %s (%s): stopping %d job(s), %gs to finish",
                p.run_name,
                p.preemptor_run_name,
                p.rule,
                len(p.job_ids),
                settings.grace_period,
                extra={"event": "run_preempted", "run_name": p.run_name, "preemptor": p.preemptor_run_name},
            )
        if done:
            self.ctx.telemetry.inc("corral_preemptions_total", by=len(done))
            self.ctx.wakeups.wake("jobs")
        return len(done)
