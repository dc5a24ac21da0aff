"""A pass over the queue's head: ``schedule``'s placements without working out again the gangs that only wait.

A long queue behind a full fleet is mostly gangs that were told to wait and will be told the same: a job's
end frees one block, a pass places the next job there, and every gang after it waits as before. Slurm's
main scheduling loop stops at that point and leaves the rest of the queue to its periodic backfill; this
does the same, exactly. ``schedule_head(snapshot, now, settled)`` takes the gangs in ``schedule``'s order and
works each one out as ``schedule`` does until no capacity is left anywhere: no instance has a free block and
no fleet can take a new instance (each is at its ``nodes.max`` or has no offers). From there on a gang can
only wait (or fail), so a gang whose jobs are all ``settled`` (told to wait by an earlier pass over the
same fleets, the caller's bookkeeping) is skipped; every other gang is still worked out, at the same
capacity ``schedule`` would have left it.

The plan is ``schedule(snapshot, now)``'s, less the skipped gangs' decisions, which can only be a new
wording of their wait (the counts a message names): the same placements, reservations, reclaims and
failures, the same decisions for every gang not skipped. Where that cannot be shown it returns None and the
caller makes a whole pass: the snapshot has quotas, fair shares or holds (they order or hold capacity across
the whole queue); a queued job has waited past ``hold_after`` (it would hold fleets); a skipped gang's
retry deadline has passed or it may not wait at all (it would fail).

Pure; imports the scheduler's types, ledger and ``schedule``'s gang step only.
"""

from __future__ import annotations

from collections.abc import Collection
from functools import partial
from itertools import compress
from operator import attrgetter, is_not

from corral.scheduler.ledger import Ledger, initial_ledger
from corral.scheduler.pass_memo import PassMemo
from corral.scheduler.schedule import queue_gangs, schedule_gang
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


def schedule_head(snapshot: Snapshot, now: float, settled: Collection[str]) -> Plan | None:
    """``schedule(snapshot, now)`` without the decisions of the gangs of ``settled`` jobs once capacity has
    run out; None where the caller must make a whole pass (see the module's docstring)."""
    if snapshot.quotas or snapshot.shares or snapshot.holds:
        return None
    queue = snapshot.queue
    if queue and _must_pass_whole(queue, now, snapshot.hold_after):
        return None
    ledger = initial_ledger(snapshot)
    memo, repeat, held = PassMemo(), RepeatWait(), set[str]()
    out: list[Gang] = []

    def work_out(run_id: str, jobs: list[QueuedJob]) -> None:
        decisions = schedule_gang(jobs, snapshot, ledger, now, held, memo, None, None, repeat, (0, 0))
        if decisions:
            out.append(Gang(run_id, tuple(decisions), jobs[0].project_id))

    gangs = iter(queue_gangs(queue).items())
    full = no_room_left(snapshot, ledger)
    if not full:
        for (run_id, _replica), jobs in gangs:
            version = ledger.version
            work_out(run_id, jobs)
            if ledger.version != version and no_room_left(snapshot, ledger):
                full = True
                break
    if full:  # from here on a gang can only wait or fail: those with a job not settled are worked out
        unsettled = set(map(_ID, queue)).difference(settled)
        if unsettled:
            pending = set(map(_GANG, compress(queue, map(unsettled.__contains__, map(_ID, queue)))))
            for (run_id, replica), jobs in gangs:
                if (run_id, replica) in pending:
                    work_out(run_id, jobs)
    return Plan(tuple(out))


def _must_pass_whole(queue: tuple[QueuedJob, ...], now: float, hold_after: float | None) -> bool:
    """Whether a job waited past ``hold_after`` (it holds the fleets it could use from now on: the rest of
    the queue sees that), or may not wait or is past its retry deadline (it fails now, and a skipped gang
    would not). Over the whole queue, in C: a job of the head is worked out either way, and one past its
    deadline leaves the queue with the whole pass made for it."""
    if hold_after is not None and min(map(_SUBMITTED, queue)) <= now - hold_after:
        return True
    if not all(map(_MAY_WAIT, queue)):
        return True
    deadlines = list(filter(_not_none, map(_DEADLINE, queue)))
    return bool(deadlines) and min(deadlines) <= now


_ID = attrgetter("id")
_GANG = attrgetter("run_id", "replica_num")
_SUBMITTED = attrgetter("submitted_at")
_MAY_WAIT = attrgetter("wait.may_wait")
_DEADLINE = attrgetter("wait.deadline")
_not_none = partial(is_not, None)
