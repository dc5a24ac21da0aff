"""The queue kept in the order a pass takes it, job by job as jobs come, change and leave.

``schedule`` sorts the whole queue on every pass (``queue_gangs``). A pass over the queue's head
(``head_pass``) looks at the first gangs only, and at the few jobs no pass has told to wait yet: with a
``QueueOrder`` kept by the caller across passes, it neither sorts the queue again nor scans it for the
earliest submission, retry deadline or a job that may not wait (``first_submitted``, ``first_deadline``,
``all_may_wait``). Each change costs a binary search and a move of the list's tail (in C); a pass costs
what it reads.

The order is ``schedule``'s: priority (higher first), then submission time, run, replica, job number and
id (``order_key``). A gang is a run's replica: its jobs in that order, taken where its first job stands.
Each project's gangs are kept in that order too, kind by kind (``pass_memo.stable_kind``): a pass in fair-share
order takes the projects' queues side by side, and reads no more of a kind's settled gangs once that kind found
no room (``settled_skip``).

Pure; imports the scheduler's types and ``pass_memo.stable_kind`` only.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TypeVar

from corral.scheduler.pass_memo import StableKind, stable_kind
from corral.scheduler.types import QueuedJob

#: Where a job stands in the queue: ``(-priority, submitted_at, run_id, replica_num, job_num, id)``.
OrderKey = tuple[int, float, str, int, int, str]
#: A gang: a run's replica.
GangKey = tuple[str, int]


def order_key(job: QueuedJob) -> OrderKey:
    return (-job.priority, job.submitted_at, job.run_id, job.replica_num, job.job_num, job.id)


class QueueOrder:
    """The queued jobs by id, their order, each gang's jobs, and the times a head pass checks."""

    def __init__(self, jobs: Iterable[QueuedJob] = ()) -> None:
        self._jobs: dict[str, QueuedJob] = {}
        self._keys: list[OrderKey] = []
        self._gangs: dict[GangKey, list[OrderKey]] = {}
        self._submitted: list[tuple[float, str]] = []
        self._deadlines: list[tuple[float, str]] = []
        self._impatient: set[str] = set()
        #: project id -> kind of gang (``pass_memo.stable_kind``) -> the places of its gangs of that kind, in order
        self._kind_places: dict[str, dict[StableKind | None, list[OrderKey]]] = {}
        #: gang -> its kind
        self._gang_kind: dict[GangKey, StableKind | None] = {}
        for job in jobs:
            self.put(job)

    def __len__(self) -> int:
        return len(self._jobs)

    @property
    def jobs(self) -> Mapping[str, QueuedJob]:
        """The queued jobs by id."""
        return self._jobs

    def get(self, job_id: str) -> QueuedJob | None:
        return self._jobs.get(job_id)

    def put(self, job: QueuedJob) -> None:
        """Add ``job``, or put it where its new priority or times place it."""
        if job.id in self._jobs:
            self.remove(job.id)
        self._jobs[job.id] = job
        key = order_key(job)
        insort(self._keys, key)
        gang = (job.run_id, job.replica_num)
        self._forget_gang(gang, job.project_id)
        insort(self._gangs.setdefault(gang, []), key)
        self._count_gang(gang, job.project_id)
        insort(self._submitted, (job.submitted_at, job.id))
        if job.wait.deadline is not None:
            insort(self._deadlines, (job.wait.deadline, job.id))
        if not job.wait.may_wait:
            self._impatient.add(job.id)

    def remove(self, job_id: str) -> None:
        """Take the job out (one not in the queue: nothing)."""
        job = self._jobs.pop(job_id, None)
        if job is None:
            return
        key = order_key(job)
        _drop(self._keys, key)
        gang = (job.run_id, job.replica_num)
        self._forget_gang(gang, job.project_id)
        _drop(self._gangs[gang], key)
        if not self._gangs[gang]:
            del self._gangs[gang]
        else:
            self._count_gang(gang, job.project_id)
        _drop(self._submitted, (job.submitted_at, job.id))
        if job.wait.deadline is not None:
            _drop(self._deadlines, (job.wait.deadline, job.id))
        self._impatient.discard(job_id)

    def gangs(self) -> Iterator[tuple[GangKey, list[QueuedJob]]]:
        """The gangs in pass order, each with its jobs, made as they are asked for (``queue_gangs``'s)."""
        seen: set[GangKey] = set()
        for key in self._keys:
            gang = (key[2], key[3])
            if gang not in seen:
                seen.add(gang)
                yield gang, self.gang_jobs(gang)

    def _forget_gang(self, gang: GangKey, project_id: str) -> None:
        """Take the gang out of its project's places by kind (a gang not there: nothing)."""
        keys = self._gangs.get(gang)
        if not keys:
            return
        kinds = self._kind_places[project_id]
        kind = self._gang_kind.pop(gang)
        _drop(kinds[kind], keys[0])
        if not kinds[kind]:
            del kinds[kind]
            if not kinds:
                del self._kind_places[project_id]

    def _count_gang(self, gang: GangKey, project_id: str) -> None:
        kind = self._gang_kind[gang] = stable_kind(self.gang_jobs(gang))
        insort(self._kind_places.setdefault(project_id, {}).setdefault(kind, []), self._gangs[gang][0])

    def projects(self) -> Iterable[str]:
        """The projects with queued jobs."""
        return self._kind_places.keys()

    def project_names(self) -> dict[str, str]:
        """The projects with queued jobs, each with its name: a step per project, not per job."""
        names = {}
        for project_id, kinds in self._kind_places.items():
            place = next(iter(kinds.values()))[0]
            names[project_id] = self._jobs[place[5]].project_name
        return names

    def kind_places(self, project_id: str) -> Mapping[StableKind | None, list[OrderKey]]:
        """The kinds of the project's gangs (``pass_memo.stable_kind``; None for a gang with ``instances``
        selectors), each with the places of its gangs in order (read only)."""
        return self._kind_places.get(project_id, {})

    def waited_places(
        self, project_id: str, kind: StableKind | None, after: OrderKey | None, waited: Callable[[float], bool]
    ) -> list[OrderKey]:
        """The places after ``after`` (None: from the first) of the project's gangs of ``kind`` submitted at a
        time ``waited`` says yes to (one that is true of every time before one it is true of: they have waited
        past the starvation guard): the first only for a kind, since its fleets are the same for each; every one
        for gangs of no kind (``None``). A step per priority the kind's gangs have: at each priority those that
        waited come first."""
        places = self.kind_places(project_id).get(kind, [])
        i = 0 if after is None else bisect_right(places, after)
        out: list[OrderKey] = []
        while i < len(places):
            priority = places[i][0]
            end = bisect_right(places, priority, lo=i, key=_priority_of)
            while i < end and waited(places[i][1]):
                if kind is not None:
                    return [places[i]]
                out.append(places[i])
                i += 1
            i = end
        return out

    def gang_kind(self, gang: GangKey) -> StableKind | None:
        return self._gang_kind[gang]

    def project_gangs(self, project_id: str) -> Iterator[tuple[GangKey, list[QueuedJob]]]:
        """The project's gangs in pass order, each with its jobs."""
        for key in heapq.merge(*self.kind_places(project_id).values()):
            gang = (key[2], key[3])
            yield gang, self.gang_jobs(gang)

    def gang_jobs(self, gang: GangKey) -> list[QueuedJob]:
        return [self._jobs[k[5]] for k in self._gangs.get(gang, ())]

    def gang_place(self, gang: GangKey) -> OrderKey:
        """Where the gang stands: its first job's place."""
        return self._gangs[gang][0]

    def first_submitted(self) -> float | None:
        return self._submitted[0][0] if self._submitted else None

    def first_deadline(self) -> float | None:
        return self._deadlines[0][0] if self._deadlines else None

    def all_may_wait(self) -> bool:
        return not self._impatient


def _priority_of(key: OrderKey) -> int:
    return key[0]


_Item = TypeVar("_Item", OrderKey, tuple[float, str])


def _drop(items: list[_Item], item: _Item) -> None:
    """Remove ``item``, which is there: it was made from the job the order holds, as when it was put."""
    del items[bisect_left(items, item)]
