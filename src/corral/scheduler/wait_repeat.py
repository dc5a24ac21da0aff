"""A pass's shortcut through a long queue that waits: the next gang of the kind that just waited gets the
same wait, without being worked out again.

In a backlogged queue most gangs wait, and a run of them in a row (one project's sweep, taken one after
the other in queue or fair-share order) waits for the same reason: the same kind of gang
(:meth:`~corral.scheduler.pass_memo.PassMemo.gang_kind`, which includes the project), on the same
capacity (the ledger's version and the fleets held for earlier jobs), against the same quota charge and
the same shares (nothing was taken since: a waiting gang takes nothing). Such a gang's decisions are the
previous gang's message, for each of its jobs whose status message differs, exactly what
``schedule._schedule_gang`` would decide; what depends on the gang itself is checked here (whether it may
wait at all, its retry deadline, the starvation guard), and a gang that differs in any of them is worked
out in full. Only the gang right after the one remembered may use it: whatever ran in between forgets it.

Pure; imports the scheduler's types only.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from corral.scheduler.types import Decision, QueuedJob, Snapshot, Wait


class RepeatWait:
    def __init__(self) -> None:
        self._key: Hashable | None = None
        self._message = ""
        #: a capacity wait (the gang's own waiting policy matters) rather than a quota wait (it does not)
        self._capacity = False
        #: the last ``reuse`` answered: the caller skips the bookkeeping the worked-out gang already did
        self.hit = False

    def remember(self, key: Hashable | None, message: str, *, capacity: bool) -> None:
        """The gang at ``key`` waits with ``message`` (``capacity``: for capacity, not for its quota)."""
        self._key, self._message, self._capacity = key, message, capacity

    def forget(self) -> None:
        self._key = None

    def reuse(
        self, key: Hashable | None, jobs: Sequence[QueuedJob], snapshot: Snapshot, now: float
    ) -> list[Decision] | None:
        """The decisions of a gang at ``key`` if it waits as the gang remembered does; None: work it out."""
        self.hit = False
        if key is None or key != self._key:
            return None
        head = jobs[0]
        if self._capacity:
            if not head.wait.may_wait or (head.wait.deadline is not None and now >= head.wait.deadline):
                return None
            if snapshot.hold_after is not None and now - head.submitted_at >= snapshot.hold_after:
                return None  # it holds its fleets for itself from now on
        self.hit = True
        return [Wait(j.id, self._message) for j in jobs if j.status_message != self._message]
