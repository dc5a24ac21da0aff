"""Which pass the scheduling worker makes: a whole pass (``scheduler.schedule``) or one over the queue's head
(``scheduler.head_pass``), and the bookkeeping that lets the head pass skip what an earlier pass told to wait.

A pass over the head is made when the fleets are those the last pass saw (``fleets_key``), so are the projects
with queued jobs (one that comes or goes changes the fair-share notes of every other project's waits, which
the head pass would leave as they were), a whole pass was made within the safety-net interval and preemption
is off; ``schedule_head`` itself asks for a whole pass
where it cannot show the same plan (holds, a job at its deadline, one that may not wait).

The whole pass made on the safety-net interval is what tells the waits a head pass left out what changed for them
(another project's share, a quota freed). Its cost grows with the queue (about 1.1 s of CPU at 96,000 queued jobs
on a 2-core machine, against 18 ms for a head pass): every 5 s that would be a fifth of a core, and the server's
loop held for a second at a time. So it is made at most once every ``WHOLE_PASS_SPACING`` times its own last cost,
when that is longer than the interval: at most 1/20 of the worker's time, and a waiting job's message at most that
stale.
Imports the scheduler only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable

from corral.scheduler.head_pass import schedule_head
from corral.scheduler.queue_order import QueueOrder
from corral.scheduler.schedule import schedule
from corral.scheduler.types import Assign, Fail, FleetSlot, Plan, Reserve, Snapshot

#: A whole pass made on the safety-net interval waits at least this many times its last cost.
WHOLE_PASS_SPACING = 20.0


class PassChoice:
    def __init__(self, safety_net_interval: float, clock: Callable[[], float] = time.perf_counter) -> None:
        self.safety_net_interval = safety_net_interval
        #: Times a whole pass (seconds, any origin).
        self._clock = clock
        #: What the last whole pass took.
        self._whole_cost = 0.0
        #: Queued jobs no pass over the fleets of ``_fleets_key`` has told to wait yet: those that came since
        #: the last pass, and those it placed, reserved for or failed (still queued if the commit refused).
        #: Every other queued job is settled.
        self._pending: set[str] = set()
        #: Whether the last pass left queued jobs waiting (none: the next pass is whole).
        self._waiting = False
        self._fleets_key: tuple[object, ...] = ()
        self._projects: frozenset[str] = frozenset()
        #: When the last pass over the whole queue was made (one at least every safety-net interval).
        self._whole_at = float("-inf")

    def came(self, job_ids: Iterable[str]) -> None:
        """Jobs first seen in the queue (or seen again after they were forgotten): no pass settled them."""
        self._pending.update(job_ids)

    def plan(self, snapshot: Snapshot, now: float, preemption: bool, order: QueueOrder | None = None) -> Plan:
        """The pass's plan: ``schedule``'s over the queue's head where that is the same, else a whole pass.
        ``order``: ``snapshot.queue`` in pass order, kept across passes (None: sorted when needed)."""
        key = fleets_key(snapshot.fleets)
        projects = frozenset(order.projects()) if order is not None else frozenset(j.project_id for j in snapshot.queue)
        plan = None
        if (
            self._waiting
            and key == self._fleets_key
            and projects == self._projects
            and now - self._whole_at < self.whole_interval()
            and not preemption
        ):
            plan = schedule_head(snapshot, now, self._pending, order)
        if plan is None:
            started = self._clock()
            plan, self._whole_at = schedule(snapshot, now), now
            self._whole_cost = self._clock() - started
        self._fleets_key, self._projects = key, projects
        return plan

    def whole_interval(self) -> float:
        """The longest a head pass follows the last whole pass: the safety-net interval, or
        ``WHOLE_PASS_SPACING`` times what the whole pass took when that is longer."""
        return max(self.safety_net_interval, WHOLE_PASS_SPACING * self._whole_cost)

    def planned(self, plan: Plan, queued: Collection[str]) -> None:
        """After ``plan`` was applied: the ``queued`` jobs it did not place, reserve for or fail are settled."""
        decided = {d.job_id for g in plan.gangs for d in g.decisions if isinstance(d, (Assign, Reserve, Fail))}
        self._pending = {job_id for job_id in decided if job_id is not None and job_id in queued}
        self._waiting = len(queued) > len(self._pending)


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
