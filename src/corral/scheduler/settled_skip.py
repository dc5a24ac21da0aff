"""The gangs a pass over the queue's head may leave out: settled ones (told to wait by an earlier pass) that this
pass would tell to wait again (``schedule._waits_again`` decides which, gang by gang).

In fair-share order the projects' queues are read side by side (``fair_share.fair_order_of`` over the kept
order's ``QueueOrder.project_gangs``). Once every kind of gang a project has queued found no room in the pass,
every settled gang left in its queue waits again (capacity only goes down within a pass), so its queue is
narrowed to its pending gangs (those with a job no pass has told to wait yet): the pass then costs the gangs
it works out, not the queue's length. Dropping gangs that take nothing and move no share changes neither the
order of the others (a merge by key at the shares of the moment) nor anything they are told.

Pure; imports the scheduler's types, queue order, pass memo and fair share's project queue only.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

from corral.scheduler.fair_share import ProjectQueue
from corral.scheduler.pass_memo import PassMemo
from corral.scheduler.queue_order import GangKey, QueueOrder
from corral.scheduler.types import QueuedJob

Gang = tuple[GangKey, list[QueuedJob]]


class SettledSkip:
    def __init__(self, order: QueueOrder, pending: Collection[str]) -> None:
        self.order = order
        self.pending = pending
        self._narrowed: set[str] = set()
        #: project id -> how many kinds had found no room when one of its kinds was last seen with room
        self._checked: dict[str, int] = {}
        self._pending_gangs: dict[str, list[GangKey]] | None = None

    def settled(self, jobs: list[QueuedJob]) -> bool:
        """Whether no job of the gang is pending."""
        return all(job.id not in self.pending for job in jobs)

    def gangs(self) -> dict[GangKey, list[QueuedJob]]:
        """The queue's gangs in pass order (``schedule.queue_gangs``'s)."""
        return dict(self.order.gangs())

    def queues(self) -> dict[str, ProjectQueue]:
        """Each project's gangs in pass order, for ``fair_share.fair_order_of``."""
        return {pid: ProjectQueue(self.order.project_gangs(pid)) for pid in self.order.projects()}

    def after_skipping(self, gang: Gang, queues: dict[str, ProjectQueue], memo: PassMemo) -> None:
        """``gang`` was left out: if every kind its project has queued found no room, narrow the project's queue
        to its pending gangs after this one."""
        pid = gang[1][0].project_id
        if pid in self._narrowed or pid not in queues or self._checked.get(pid) == memo.kinds_without_room:
            return
        for stable in self.order.project_kinds(pid):
            kind = memo.kind_of(stable)
            if kind is None or not memo.found_no_room(kind):
                self._checked[pid] = memo.kinds_without_room  # nothing to see again before another kind has none
                return
        self._narrowed.add(pid)
        queues[pid].only(self._pending_after(pid, gang[0]))

    def _pending_after(self, project_id: str, gang: GangKey) -> Iterator[Gang]:
        if self._pending_gangs is None:
            by_project: dict[str, set[GangKey]] = {}
            for job in filter(None, map(self.order.get, self.pending)):
                by_project.setdefault(job.project_id, set()).add((job.run_id, job.replica_num))
            self._pending_gangs = {p: sorted(g, key=self.order.gang_place) for p, g in by_project.items()}
        place = self.order.gang_place(gang)
        for other in self._pending_gangs.get(project_id, ()):
            if self.order.gang_place(other) > place:
                yield other, self.order.gang_jobs(other)
