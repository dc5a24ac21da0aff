"""A pass's shortcut through a long queue that waits: a gang of a kind that already waited in this pass,
with nothing it depends on changed since, gets the same wait without being worked out again.

In a backlogged queue most gangs wait, and the gangs of one kind (one project's sweep: the same
:meth:`~corral.scheduler.pass_memo.PassMemo.gang_kind`, which includes the project) wait for the same
reason while the pass takes nothing: the same capacity (the ledger's version and the fleets held for
earlier jobs), the same quota charge, the same shares and the same fair-share notes (what the projects
taken earlier recorded, ``fair_share.FairNote``). A gang whose ``context`` (those versions) is the one its
kind last waited at gets that wait: its jobs whose status message differs, exactly what
``schedule.schedule_gang`` would decide. What depends on the gang itself is checked here (whether it may
wait at all, its retry deadline, the starvation guard); a gang that differs in any of them is worked out
in full. A gang past the starvation guard holds the fleets it could use for itself from then on; once they are
all held (by an earlier gang of its kind), its hold changes nothing, and it gets its kind's wait like any other.

Pure; imports the scheduler's types only.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from corral.scheduler.types import Decision, QueuedJob, Snapshot, Wait


class RepeatWait:
    def __init__(self) -> None:
        #: kind -> (the context it waited at, its message, whether a capacity wait rather than a quota one, whether
        #: every fleet it could use was held after it waited)
        self._seen: dict[Hashable, tuple[Hashable, str, bool, bool]] = {}
        #: the last ``reuse`` answered: the caller skips the bookkeeping the worked-out gang already did
        self.hit = False

    def remember(
        self, kind: Hashable | None, context: Hashable, message: str, *, capacity: bool, all_held: bool = False
    ) -> None:
        """A gang of ``kind`` waits at ``context`` with ``message`` (``capacity``: for capacity, not for
        its quota, so that the gang's own waiting policy matters; ``all_held``: every fleet it could use was held
        once it waited, so a gang past the starvation guard at the same context would hold nothing new)."""
        if kind is not None:
            self._seen[kind] = (context, message, capacity, all_held)

    def reuse(
        self, kind: Hashable | None, context: Hashable, jobs: Sequence[QueuedJob], snapshot: Snapshot, now: float
    ) -> list[Decision] | None:
        """The decisions of a gang of ``kind`` at ``context`` if it waits as its kind did; None: work it out."""
        self.hit = False
        seen = self._seen.get(kind) if kind is not None else None
        if seen is None or seen[0] != context:
            return None
        _, message, capacity, all_held = seen
        head = jobs[0]
        if capacity:
            if not head.wait.may_wait or (head.wait.deadline is not None and now >= head.wait.deadline):
                return None
            if not all_held and snapshot.hold_after is not None and now - head.submitted_at >= snapshot.hold_after:
                return None  # it holds its fleets for itself from now on
        self.hit = True
        return [Wait(j.id, message) for j in jobs if j.status_message != message]
