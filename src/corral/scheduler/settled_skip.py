"""The gangs a pass over the queue's head may leave out: settled ones (told to wait by an earlier pass) that this
pass would tell to wait again (``schedule._waits_again`` decides which, gang by gang).

In fair-share order the projects' queues are read side by side (``fair_share.fair_order_of``), each project's
as its kinds of gang merged by place (``QueueOrder.kind_places``). Once a kind found no room in the pass, every
settled gang of it still to come waits again (capacity only goes down within a pass), so that kind's queue is
narrowed to its pending gangs (those with a job no pass has told to wait yet): the pass then costs the gangs it
works out, not the queue's length. Leaving out gangs that take nothing and move no share changes neither the
order of the others (a merge by key at the shares of the moment) nor anything they are told.

Pure; imports the scheduler's types, queue order and pass memo only.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterator

from corral.scheduler.pass_memo import PassMemo, StableKind
from corral.scheduler.queue_order import GangKey, OrderKey, QueueOrder
from corral.scheduler.types import QueuedJob

Gang = tuple[GangKey, list[QueuedJob]]


class KindQueues:
    """One project's gangs in pass order: its kinds' places merged, a kind's narrowed on request. ``head`` is
    the next gang (None: none left) and ``pop`` takes it, as ``fair_share.fair_order_of`` asks."""

    def __init__(self, order: QueueOrder, project_id: str) -> None:
        self._order = order
        self.kinds = list(order.kind_places(project_id))
        self._places: list[Iterator[OrderKey]] = [iter(p) for p in order.kind_places(project_id).values()]
        self._generation = [0] * len(self.kinds)
        #: (place, the kind's generation when pushed, the kind's index): one entry per kind still read
        self._heap: list[tuple[OrderKey, int, int]] = []
        for k in range(len(self.kinds)):
            self._push(k)
        self.head: Gang | None = None
        self._head_kind = -1
        self._advance()

    def pop(self) -> Gang:
        gang = self.head
        assert gang is not None
        self._advance()
        return gang

    def narrow(self, k: int, places: Iterator[OrderKey]) -> None:
        """From here on kind ``k`` (an index of ``kinds``) gives only ``places`` (after the gang popped last)."""
        self._generation[k] += 1
        self._places[k] = places
        self._push(k)
        if self._head_kind == k:  # read ahead before the kind was narrowed
            self._advance()

    def _push(self, k: int) -> None:
        place = next(self._places[k], None)
        if place is not None:
            heapq.heappush(self._heap, (place, self._generation[k], k))

    def _advance(self) -> None:
        while self._heap:
            place, generation, k = heapq.heappop(self._heap)
            if generation != self._generation[k]:
                continue  # the kind was narrowed since
            self._push(k)
            gang = (place[2], place[3])
            self.head, self._head_kind = (gang, self._order.gang_jobs(gang)), k
            return
        self.head, self._head_kind = None, -1


class SettledSkip:
    def __init__(self, order: QueueOrder, pending: Collection[str], waited: Callable[[float], bool] | None) -> None:
        self.order = order
        self.pending = pending
        #: whether a gang submitted at a time has waited past the starvation guard (None: there is none)
        self.waited = waited
        #: project id -> how many kinds had found no room when its kinds were last looked at
        self._checked: dict[str, int] = {}
        self._narrowed: set[tuple[str, int]] = set()
        self._pending_places: dict[tuple[str, StableKind | None], list[OrderKey]] | None = None

    def settled(self, jobs: list[QueuedJob]) -> bool:
        """Whether no job of the gang is pending."""
        return all(job.id not in self.pending for job in jobs)

    def gangs(self) -> dict[GangKey, list[QueuedJob]]:
        """The queue's gangs in pass order (``schedule.queue_gangs``'s)."""
        return dict(self.order.gangs())

    def queues(self) -> dict[str, KindQueues]:
        """Each project's gangs in pass order, for ``fair_share.fair_order_of``."""
        return {pid: KindQueues(self.order, pid) for pid in self.order.projects()}

    def after_skipping(self, gang: Gang, queues: dict[str, KindQueues], memo: PassMemo) -> None:
        """``gang`` was left out: narrow each kind of its project that found no room to its pending gangs after
        this one, and its first gang after this one past the starvation guard (which would hold the fleets the
        kind could use, if they are not held yet: ``schedule.holds_nothing_new``; every later one would hold
        nothing new)."""
        pid = gang[1][0].project_id
        if self._checked.get(pid) == memo.kinds_without_room:
            return
        self._checked[pid] = memo.kinds_without_room  # nothing new to narrow before another kind finds no room
        place = self.order.gang_place(gang[0])
        queue = queues[pid]
        for k, stable in enumerate(queue.kinds):
            if (pid, k) in self._narrowed:
                continue
            kind = memo.kind_of(stable)
            if kind is not None and memo.found_no_room(kind):
                self._narrowed.add((pid, k))
                later: Iterator[OrderKey] = (p for p in self._pending_of(pid, stable) if p > place)
                if self.waited is not None:
                    later = _merged(later, self.order.waited_places(pid, stable, place, self.waited))
                queue.narrow(k, later)

    def _pending_of(self, project_id: str, kind: StableKind | None) -> list[OrderKey]:
        """The places of the project's gangs of ``kind`` with a pending job, in order."""
        if self._pending_places is None:
            places: dict[tuple[str, StableKind | None], set[OrderKey]] = {}
            for job in filter(None, map(self.order.get, self.pending)):
                gang = (job.run_id, job.replica_num)
                key = (job.project_id, self.order.gang_kind(gang))
                places.setdefault(key, set()).add(self.order.gang_place(gang))
            self._pending_places = {key: sorted(p) for key, p in places.items()}
        return self._pending_places.get((project_id, kind), [])


def _merged(places: Iterator[OrderKey], more: list[OrderKey]) -> Iterator[OrderKey]:
    """Two runs of places in order, merged, each place once."""
    last: OrderKey | None = None
    for place in heapq.merge(places, more):
        if place != last:
            yield place
            last = place
