"""Which pass the scheduling worker makes: a whole pass (``scheduler.schedule``) or one over the queue's head
(``scheduler.head_pass``), and the bookkeeping that lets the head pass skip what an earlier pass told to wait.

A pass over the head is made when the fleets are those the last pass saw (``fleets_key``), a whole pass was
made within the safety-net interval and preemption is off; ``schedule_head`` itself asks for a whole pass
where it cannot show the same plan (quotas, shares, holds, a job at its deadline or the starvation guard).
Imports the scheduler only.
"""

from __future__ import annotations

from collections.abc import Collection

from corral.scheduler.head_pass import schedule_head
from corral.scheduler.schedule import schedule
from corral.scheduler.types import Assign, Fail, FleetSlot, Plan, Reserve, Snapshot


class PassChoice:
    def __init__(self, safety_net_interval: float) -> None:
        self.safety_net_interval = safety_net_interval
        #: Queued jobs the last pass told to wait (or left waiting), over the fleets of ``_fleets_key``.
        self._settled: set[str] = set()
        self._fleets_key: tuple[object, ...] = ()
        #: When the last pass over the whole queue was made (one at least every safety-net interval).
        self._whole_at = float("-inf")

    def plan(self, snapshot: Snapshot, now: float, preemption: bool) -> Plan:
        """The pass's plan: ``schedule``'s over the queue's head where that is the same, else a whole pass."""
        key = fleets_key(snapshot.fleets)
        plan = None
        if (
            self._settled
            and key == self._fleets_key
            and now - self._whole_at < self.safety_net_interval
            and not preemption
        ):
            plan = schedule_head(snapshot, now, self._settled)
        if plan is None:
            plan, self._whole_at = schedule(snapshot, now), now
        self._fleets_key = key
        return plan

    def planned(self, plan: Plan, queued: Collection[str]) -> None:
        """After ``plan`` was applied: the ``queued`` jobs it did not place, reserve for or fail are settled."""
        decided = {d.job_id for g in plan.gangs for d in g.decisions if isinstance(d, (Assign, Reserve, Fail))}
        self._settled = set(queued).difference(decided)


def fleets_key(fleets: tuple[FleetSlot, ...]) -> tuple[object, ...]:
    """What of the fleets decides whether a waiting job could ever be placed or fail, apart from their
    instances' busy blocks: the fleets, their bounds and offers, and which instances they have."""
    return tuple(
        (
            f.id,
            f.nodes_min,
            f.nodes_max,
            f.blocks,
            f.placement,
            f.offers,
            f.importer_project_ids,
            f.reservation,
            tuple((i.id, i.status == "terminating", i.total_blocks) for i in f.instances),
        )
        for f in fleets
    )
