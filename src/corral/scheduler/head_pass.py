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
a skipped gang's retry deadline has passed or it may not wait at all (it would fail).

A gang that has waited past the starvation guard (``hold_after``) holds the fleets its kind could use against
every gang after it in the pass. In a long backlog that is most of the queue, so the head pass keeps it
exact rather than giving way to a whole pass: of each kind, the first settled gang past the guard is worked out
(``first_holders``, ``settled_skip``), and a later one is skipped only where it would hold nothing that is not
held already (``schedule.holds_nothing_new``).

Pure; imports the scheduler's types, ledger, queue order, ``schedule``'s gang step and skipping pass, and
``settled_skip`` only.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from corral.scheduler.ledger import Ledger, initial_ledger
from corral.scheduler.pass_memo import PassMemo
from corral.scheduler.queue_order import GangKey, OrderKey, QueueOrder
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
    if _must_pass_whole(order, now):
        return None
    waited = _waited(snapshot.hold_after, now)
    if snapshot.quotas or snapshot.shares:
        return schedule_skipping(snapshot, now, SettledSkip(order, pending, waited))
    return _head_until_full(snapshot, now, pending, order, waited)


def _waited(hold_after: float | None, now: float) -> Callable[[float], bool] | None:
    """Whether a job submitted at a time has waited past the starvation guard (None: there is none), as
    ``schedule.schedule_gang`` tells it."""
    if hold_after is None:
        return None
    return lambda submitted_at: now - submitted_at >= hold_after


def _head_until_full(
    snapshot: Snapshot,
    now: float,
    pending: Collection[str],
    order: QueueOrder,
    waited: Callable[[float], bool] | None,
) -> Plan:
    """The gangs in order until no capacity is left anywhere, then those with a job not settled, and of each
    kind the first gang past the starvation guard (``waited``): it holds the fleets its kind could use, for
    itself, from there on (``first_holders``)."""
    ledger = initial_ledger(snapshot)
    memo, repeat, held = PassMemo(), RepeatWait(), set[str]()
    out: list[Gang] = []

    def work_out(run_id: str, jobs: list[QueuedJob]) -> None:
        decisions = schedule_gang(jobs, snapshot, ledger, now, held, memo, None, None, repeat, (0, 0))
        if decisions:
            out.append(Gang(run_id, tuple(decisions), jobs[0].project_id))

    worked_out: set[GangKey] = set()
    last: OrderKey | None = None
    full = no_room_left(snapshot, ledger)
    if not full:
        for gang, jobs in order.gangs():
            version = ledger.version
            work_out(gang[0], jobs)
            worked_out.add(gang)
            last = order.gang_place(gang)
            if ledger.version != version and no_room_left(snapshot, ledger):
                full = True
                break
    if full:  # from here on a gang can only wait or fail: those with a job not settled are worked out
        later = {(j.run_id, j.replica_num) for j in map(order.get, pending) if j is not None} - worked_out
        if waited is not None:
            later.update(first_holders(order, last, waited))
        for gang in sorted(later, key=order.gang_place):
            work_out(gang[0], order.gang_jobs(gang))
    return Plan(tuple(out))


def first_holders(order: QueueOrder, after: OrderKey | None, waited: Callable[[float], bool]) -> set[GangKey]:
    """Of each project's kinds of gang, the first gang after ``after`` (None: from the first) that waited past
    the starvation guard, and every such gang of no kind. Worked out, the first holds the fleets its kind could
    use (``schedule.schedule_gang``), so every later gang of the kind past the guard holds none that is not held
    already, and is told to wait as before: it may be skipped."""
    out: set[GangKey] = set()
    for project_id in order.projects():
        for kind in order.kind_places(project_id):
            out.update((p[2], p[3]) for p in order.waited_places(project_id, kind, after, waited))
    return out


def _must_pass_whole(order: QueueOrder, now: float) -> bool:
    """Whether a job may not wait or is past its retry deadline (it fails now, and a skipped gang would not):
    a job of the head is worked out either way, and one past its deadline leaves the queue with the whole pass
    made for it."""
    if not order.all_may_wait():
        return True
    deadline = order.first_deadline()
    return deadline is not None and deadline <= now
