"""Fair share in the pure pass: when projects with a scheduling policy compete for the same fleets, the
next gang taken is the head of the project with the lowest weighted dominant resource share (Kueue's
fair-sharing count: per resource, what the project holds above its nominal quota over the capacity of the
fleets it can use, the largest of these, divided by its weight; 0 while within nominal), then higher
priority, then older; within a project, priority then age as before. Every gang is still tried (a head
that does not fit does not block the others: work-conserving), and what a gang takes raises its
project's share for the rest of the pass.

``Snapshot.shares`` turns it on (the projects' weights, nominal quotas and holdings); empty, the queue
order is unchanged. Pure: imports only ``corral.domain`` and the scheduler's types.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from corral.domain.quotas import QuotaPolicy, Usage, add, charge, weighted_share
from corral.domain.resources import InstanceResources
from corral.domain.statuses import ENDING_INSTANCE
from corral.scheduler.types import Assign, Decision, InstanceSlot, QueuedJob, Reserve, Snapshot

Gang = tuple[tuple[str, int], list[QueuedJob]]


@dataclass
class ShareBook:
    snapshot: Snapshot
    used: dict[str, Usage] = field(default_factory=dict)
    _share: dict[str, float] = field(default_factory=dict)
    _capacity: dict[str, Usage] = field(default_factory=dict)
    _instances: dict[str, InstanceSlot] | None = None
    #: project id -> the instances it holds jobs on, with the pass's placements (loaded with its share).
    _on: dict[str, set[str]] = field(default_factory=dict)
    #: Moves each time a project's share changes in the pass (``take`` booked something).
    generation: int = 0

    def policy(self, project_id: str) -> QuotaPolicy:
        s = self.snapshot.shares.get(project_id)
        return QuotaPolicy(weight=s.weight, nominal=s.nominal) if s is not None else QuotaPolicy()

    def capacity(self, project_id: str) -> Usage:
        """What the instances of the fleets the project can use (its own and those exported to it) have."""
        if project_id not in self._capacity:
            total: Usage = {}
            each: dict[InstanceResources, Usage] = {}  # hosts alike have the same resources: each charged once
            for f in self.snapshot.fleets:
                if f.project_id != project_id and project_id not in f.importer_project_ids:
                    continue
                for i in f.instances:
                    r = i.resources
                    if r is None or i.status in ENDING_INSTANCE:
                        continue
                    whole = each.get(r)
                    if whole is None:
                        whole = each[r] = charge([g.name for g in r.gpus], r.cpus, r.memory_mib, 0.0, 1, 1)
                    for dim, amount in whole.items():
                        total[dim] = total.get(dim, 0.0) + amount
                    total["instances"] = total.get("instances", 0.0) + 1
            total.pop("price_per_hour", None)
            self._capacity[project_id] = total
        return self._capacity[project_id]

    def share(self, project_id: str) -> float:
        if project_id not in self._share:
            held = self.used.get(project_id)
            if held is None:
                s = self.snapshot.shares.get(project_id)
                held = self.used[project_id] = dict(s.used) if s is not None else {}
                self._on[project_id] = set(s.instance_ids) if s is not None else set()
            self._share[project_id] = weighted_share(held, self.policy(project_id), self.capacity(project_id))
        return self._share[project_id]

    def take(self, project_id: str, decisions: Sequence[Decision]) -> None:
        """Book what the decisions place for the project (its share is counted again when next asked)."""
        extra: Usage = {}
        self.share(project_id)  # loads the holding and the instances it is on
        on = self._on.setdefault(project_id, set())
        for d in decisions:
            if isinstance(d, Assign):
                inst = self._instance(d.instance_id)
                if inst is None or inst.resources is None:
                    continue
                r = inst.resources
                extra = add(
                    extra, charge([g.name for g in r.gpus], r.cpus, r.memory_mib, 0.0, d.blocks, inst.total_blocks)
                )
                if d.instance_id not in on:  # counted as the holdings count it: instances it holds jobs on
                    on.add(d.instance_id)
                    extra["instances"] = extra.get("instances", 0.0) + 1
            elif isinstance(d, Reserve) and d.job_id is not None:
                r = d.offer.resources
                extra = add(
                    extra, charge([g.name for g in r.gpus], r.cpus, r.memory_mib, 0.0, d.blocks, d.total_blocks)
                )
                extra["instances"] = extra.get("instances", 0.0) + 1
        if extra:
            self.used[project_id] = add(self.used[project_id], extra)
            self._share.pop(project_id, None)
            self.generation += 1

    def _instance(self, instance_id: str) -> InstanceSlot | None:
        if self._instances is None:
            self._instances = {i.id: i for f in self.snapshot.fleets for i in f.instances}
        return self._instances.get(instance_id)


class ProjectQueue:
    """One project's gangs in queue order, read as the pass reaches them."""

    def __init__(self, gangs: Iterator[Gang]) -> None:
        self._gangs = gangs
        self.head: Gang | None = next(gangs, None)

    def pop(self) -> Gang:
        gang = self.head
        assert gang is not None
        self.head = next(self._gangs, None)
        return gang


def fair_order(gangs: Sequence[Gang], book: ShareBook) -> Iterator[Gang]:
    """The gangs (given in queue order) in fair-share order; ``book.take`` between two steps moves the
    project that took capacity back."""
    queues: dict[str, deque[Gang]] = {}
    for gang in gangs:
        queues.setdefault(gang[1][0].project_id, deque()).append(gang)
    return fair_order_of({pid: ProjectQueue(iter(q)) for pid, q in queues.items()}, book)


class GangQueue(Protocol):
    """A project's gangs in queue order: ``head`` the next (None: none left), ``pop`` takes it."""

    head: Gang | None

    def pop(self) -> Gang: ...


def fair_order_of(queues: Mapping[str, GangQueue], book: ShareBook) -> Iterator[Gang]:
    """``fair_order`` of the projects' queues: the next gang is the head of the project with the lowest key.
    Between two steps the caller may narrow the queue of the project whose gang it was given (a queue it
    narrows must keep its gangs' order)."""
    queues = {pid: q for pid, q in queues.items() if q.head is not None}
    lowest: str | None = None  # a project whose share is below every other's, at ``generation``
    generation = -1
    while queues:
        if lowest in queues and book.generation == generation:
            pid = lowest  # no share moved and it is still strictly lowest: its head comes next again
        else:
            pid = min(queues, key=lambda p: _key(p, queues[p].head, book))  # type: ignore[arg-type]
            share = book.share(pid)
            strictly = all(book.share(p) > share for p in queues if p != pid)
            lowest, generation = (pid, book.generation) if strictly else (None, -1)
        yield queues[pid].pop()
        if queues[pid].head is None:
            del queues[pid]


def _key(project_id: str, gang: Gang, book: ShareBook) -> tuple[float, int, float, str, int]:
    head = gang[1][0]
    return (book.share(project_id), -head.priority, head.submitted_at, head.run_id, head.replica_num)


class FairNote:
    """Why a gang taken in fair-share order waits: a competing project whose gang went earlier in the pass,
    with a lower weighted share, on a fleet this gang could use (``scheduling/queue`` reason ``fair_share``).
    ``earlier`` (project id -> its name, the lowest share its gangs had at their turn, the fleets they could
    use) is shared by the pass's notes; ``fleets`` gives the ids of the fleets the gang could use."""

    def __init__(
        self,
        head: QueuedJob,
        shares: ShareBook,
        earlier: dict[str, tuple[str, float, set[str]]],
        fleets: Callable[[], set[str]],
    ) -> None:
        self.head, self.earlier, self._fleets_of = head, earlier, fleets
        self.share = shares.share(head.project_id)
        self._fleets: set[str] | None = None

    def fleets(self) -> set[str]:
        if self._fleets is None:
            self._fleets = self._fleets_of()
        return self._fleets

    def __call__(self) -> str | None:
        for project_id, (name, share, fleets) in self.earlier.items():
            if project_id != self.head.project_id and share < self.share and fleets & self.fleets():
                return f"fair share: project '{name}' is further below its entitlement"
        return None

    def record(self) -> bool:
        """Remember this gang's project, at the share it had when its turn came (the lowest of its gangs);
        whether that changed what is remembered."""
        pid = self.head.project_id
        known = self.earlier.get(pid)
        if known is None:
            self.earlier[pid] = (self.head.project_name or pid, self.share, set(self.fleets()))
            return True
        if self.share < known[1]:
            self.earlier[pid] = (known[0], self.share, known[2] | self.fleets())
            return True
        if self.fleets() <= known[2]:
            return False
        known[2].update(self.fleets())
        return True
