"""A pass over the queue's head: ``schedule``'s placements without working out again the gangs that only wait.

A long queue behind a full fleet is mostly gangs that were told to wait and will be told the same: a job's
end frees one block, a pass places the next job there, and every gang after it waits as before. Slurm's
main scheduling loop stops at that point and leaves the rest of the queue to its periodic backfill; this
does the same, exactly. ``schedule_head(snapshot, now, pending)`` takes the gangs in ``schedule``'s order and
works each one out as ``schedule`` does until no capacity is left anywhere: no instance has a free block and
no fleet can take a new instance (each is at its ``nodes.max`` or has no offers). From there on a gang can
only wait (or fail), so a gang whose jobs are all settled (told to wait by an earlier pass over the same
fleets: every queued job but the ``pending`` ones, the caller's bookkeeping) is skipped; every other gang
is still worked out, at the same capacity ``schedule`` would have left it. With the queue's order kept by
the caller (``queue_order.QueueOrder``), a pass costs the gangs it works out, not the queue's length.

Under quotas or fair shares capacity is rarely all taken (a project at its ``quota.max`` leaves its fleet's
hosts free), and fair sharing orders the gangs by what each project holds as the pass places them, so the
pass goes through the whole queue in ``schedule``'s order (``schedule.schedule_skipping``), but a settled
gang of a kind that already found no room earlier in the pass (and freed no idle instance of a shared host
for itself) is skipped: capacity only goes down within a pass, so it finds none either, and what a waiting gang
could free of a shared host only shrinks.

The plan is ``schedule(snapshot, now)``'s, less the skipped gangs' decisions, which can only be a new
wording of their wait (the counts a message names): the same placements, reservations, reclaims and
failures, the same decisions for every gang not skipped. Where that cannot be shown it returns None and the
caller makes a whole pass: the snapshot has holds (capacity held for a preempting run goes back to it first);
a queued job has waited past ``hold_after`` (it would hold fleets); a skipped gang's retry deadline has passed
or it may not wait at all (it would fail).

Pure; imports the scheduler's types, ledger, queue order, ``schedule``'s gang step and skipping pass, and
``settled_skip`` only.
"""

from __future__ import annotations

from collections.abc import Collection

from corral.scheduler.ledger import Ledger, initial_ledger
from corral.scheduler.pass_memo import PassMemo
from corral.scheduler.queue_order import GangKey, QueueOrder
from corral.scheduler.schedule import schedule_gang, schedule_skipping
from corral.scheduler.settled_skip import SettledSkip
from corral.scheduler.types import Gang, Plan, QueuedJob, Snapshot
from corral.scheduler.wait_repeat import RepeatWait


def no_room_left(snapshot: Snapshot, ledger: Ledger) -> bool:
    """Whether nothing more can be placed at ``ledger``'s capacity: no instance has a free block (whatever
    its status) and no fleet can take a new instance."""
    if any(ledger.free_blocks.values()):
        return False
    for fleet in snapshot.fleets:
        if fleet.offers and (fleet.nodes_max is None or ledger.fleet_count.get(fleet.id, 0) < fleet.nodes_max):
            return False
    return True


def schedule_head(
    snapshot: Snapshot, now: float, pending: Collection[str], order: QueueOrder | None = None
) -> Plan | None:
    """``schedule(snapshot, now)`` without the decisions of the gangs of settled jobs once capacity has run
    out; None where the caller must make a whole pass (see the module's docstring). ``pending``: the ids of
    the queued jobs that are not settled (every other queued job is). ``order``: ``snapshot.queue`` in pass
    order, kept by the caller across passes (None: made here, at the cost of a sort)."""
    if snapshot.holds:
        return None
    if order is None:
        order = QueueOrder(snapshot.queue)
    if _must_pass_whole(order, now, snapshot.hold_after):
        return None
    if snapshot.quotas or snapshot.shares:
        return schedule_skipping(snapshot, now, SettledSkip(order, pending))
    return _head_until_full(snapshot, now, pending, order)


def _head_until_full(snapshot: Snapshot, now: float, pending: Collection[str], order: QueueOrder) -> Plan:
    """The gangs in order until no capacity is left anywhere, then those with a job not settled."""
    ledger = initial_ledger(snapshot)
    memo, repeat, held = PassMemo(), RepeatWait(), set[str]()
    out: list[Gang] = []

    def work_out(run_id: str, jobs: list[QueuedJob]) -> None:
        decisions = schedule_gang(jobs, snapshot, ledger, now, held, memo, None, None, repeat, (0, 0))
        if decisions:
            out.append(Gang(run_id, tuple(decisions), jobs[0].project_id))

    worked_out: set[GangKey] = set()
    full = no_room_left(snapshot, ledger)
    if not full:
        for gang, jobs in order.gangs():
            version = ledger.version
            work_out(gang[0], jobs)
            worked_out.add(gang)
            if ledger.version != version and no_room_left(snapshot, ledger):
                full = True
                break
    if full:  # from here on a gang can only wait or fail: those with a job not settled are worked out
        later = {(j.run_id, j.replica_num) for j in map(order.get, pending) if j is not None} - worked_out
        for gang in sorted(later, key=order.gang_place):
            work_out(gang[0], order.gang_jobs(gang))
    return Plan(tuple(out))


def _must_pass_whole(order: QueueOrder, now: float, hold_after: float | None) -> bool:
    """Whether a job waited past ``hold_after`` (it holds the fleets it could use from now on: the rest of
    the queue sees that), or may not wait or is past its retry deadline (it fails now, and a skipped gang
    would not): a job of the head is worked out either way, and one past its deadline leaves the queue with
    the whole pass made for it."""
    first = order.first_submitted()
    if hold_after is not None and first is not None and first <= now - hold_after:
        return True
    if not order.all_may_wait():
        return True
    deadline = order.first_deadline()
    return deadline is not None and deadline <= now
