"""What one pass of ``schedule()`` works out once and reuses for every job that asks the same question.

A queue of thousands of jobs holds few distinct shapes (a sweep's jobs all ask for the same resources), so
the pass remembers, for the snapshot it decides on:
- how a job sees a fleet (narrowed by its barred backends and its run's offer options) and the fleets
  it may use, per the job attributes those depend on;
- a fleet's instances in the order placement tries them;
- why a shape can never fit a fleet, and a kind of gang's screening (these depend on the snapshot only);
- why a kind of gang does not fit a fleet *now*, until the ledger's version for that fleet moves, and the
  blockers of a kind of gang that fitted no fleet, until any version moves (capacity only goes down within
  a pass, but the messages name counts, so they are worked out again after a change);
- the kinds of gang that found no room and waited: every later gang of such a kind finds none either
  (capacity only goes down), which lets a pass over the head skip the ones already told to wait.
Every answer is the one the uncached function gives. Entries keep the fleet they were computed for and are
used only for that same object. A gang with ``instances`` selectors (its own view of each fleet) is never
cached as a kind. Pure; imports the scheduler's types and fleet views only.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Generic, TypeVar

from corral.domain.resources import Requirements
from corral.scheduler.fleet_view import as_job_sees_it, view_key
from corral.scheduler.types import FleetSlot, InstanceSlot, QueuedJob

T = TypeVar("T")
#: A kind of gang as :func:`stable_kind` gives it: the project's id and name, the run's ``fleets``, how its jobs
#: see a fleet (``view_key``), its creation policy, and each job's requirements, multinode flag, nodes and number.
StableKind = tuple[object, object, object, object, object, tuple[tuple[Requirements, bool, int, int], ...]]


class _Keyed(Generic[T]):
    """A value computed once per key."""

    def __init__(self) -> None:
        self.seen: dict[Hashable, T] = {}

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        try:
            return self.seen[key]
        except KeyError:
            value = self.seen[key] = compute()
            return value


class PassMemo:
    def __init__(self) -> None:
        self._shapes: dict[int, tuple[Requirements, int]] = {}
        self._shape_ids: dict[Requirements, int] = {}
        self._views: _Keyed[FleetSlot] = _Keyed()
        self._candidates: _Keyed[list[FleetSlot]] = _Keyed()
        self._order: dict[int, tuple[FleetSlot, list[InstanceSlot]]] = {}
        self._hosts: dict[int, tuple[FleetSlot, tuple[str, ...]]] = {}
        self._fits: dict[Hashable, tuple[FleetSlot, str | None]] = {}
        #: (gang kind, ledger version, held fleets, the project's quota version) -> the quota's verdict there
        #: (``scheduler.quota_gate``): the same kind of gang placed alike is refused alike; and ("at max",
        #: gang kind, the project's quota version) -> ``quota_gate.at_max``'s verdict for a gang with no room.
        self.quota_refused: dict[Hashable, object] = {}
        self._screens: dict[Hashable, object] = {}
        self._no_room: dict[Hashable, tuple[FleetSlot, tuple[int, ...], str]] = {}
        self._blockers: dict[Hashable, tuple[int, int, list[str]]] = {}
        self._full: dict[Hashable, set[str]] = {}
        self._roomless: set[Hashable] = set()
        #: gang kind -> the ids of the fleets it could ever run in, for a kind that waited for capacity
        self._reach: dict[Hashable, frozenset[str]] = {}
        self._kinds: dict[StableKind, Hashable] = {}

    # ---- keys --------------------------------------------------------------------------------------
    def shape(self, req: Requirements) -> int:
        """A small number per distinct requirement (equal requirements, same number)."""
        seen = self._shapes.get(id(req))
        if seen is None or seen[0] is not req:
            n = self._shape_ids.setdefault(req, len(self._shape_ids))
            seen = self._shapes[id(req)] = (req, n)
        return seen[1]

    def gang_kind(self, jobs: Sequence[QueuedJob]) -> Hashable | None:
        """What every decision about a gang depends on but its jobs' ids, priority, submission time and
        waiting policy; None for a gang with ``instances`` selectors."""
        head = jobs[0]
        if head.selectors is not None:
            return None
        if len(jobs) == 1:  # most gangs: without the generator's cost
            shapes: tuple[tuple[int, bool, int, int], ...] = (
                (self.shape(head.requirements), head.multinode, head.nodes, head.job_num),
            )
        else:
            shapes = tuple((self.shape(j.requirements), j.multinode, j.nodes, j.job_num) for j in jobs)
        return (head.project_id, head.project_name, head.fleet_names, view_key(head), head.creation_policy, shapes)

    def kind_of(self, stable: StableKind | None) -> Hashable | None:
        """The :meth:`gang_kind` of a gang whose :func:`stable_kind` is ``stable``."""
        if stable is None:
            return None
        kind = self._kinds.get(stable)
        if kind is None:
            own = tuple((self.shape(req), multinode, nodes, num) for req, multinode, nodes, num in stable[5])
            kind = self._kinds[stable] = (*stable[:5], own)
        return kind

    # ---- what depends on the snapshot only ---------------------------------------------------------
    def view(self, job: QueuedJob, fleet: FleetSlot) -> FleetSlot:
        key = (fleet.id, view_key(job))
        return self._views.get(key, lambda: as_job_sees_it(job, fleet))

    def candidates(self, job: QueuedJob, compute: Callable[[], list[FleetSlot]]) -> list[FleetSlot]:
        """``compute()`` (the fleets ``job`` may use), once per the job attributes it depends on."""
        key = (job.project_id, job.project_name, job.fleet_names, view_key(job))
        return self._candidates.get(key, compute)

    def ordered(
        self, fleet: FleetSlot, order: Callable[[Iterable[InstanceSlot]], list[InstanceSlot]]
    ) -> list[InstanceSlot]:
        seen = self._order.get(id(fleet))
        if seen is None or seen[0] is not fleet:
            seen = self._order[id(fleet)] = (fleet, order(fleet.instances))
        return seen[1]

    def host_backends(self, fleet: FleetSlot) -> tuple[str, ...]:
        """The shared hosts ``fleet``'s offers are carved out of."""
        seen = self._hosts.get(id(fleet))
        if seen is None or seen[0] is not fleet:
            hosts = tuple(sorted({o.backend for o in fleet.offers if o.host_blocks}))
            seen = self._hosts[id(fleet)] = (fleet, hosts)
        return seen[1]

    def never_fits(
        self, fleet: FleetSlot, job: QueuedJob, reuse_only: bool, compute: Callable[[], str | None]
    ) -> str | None:
        key = (id(fleet), self.shape(job.requirements), job.multinode, job.nodes, job.max_price, reuse_only)
        seen = self._fits.get(key)
        if seen is None or seen[0] is not fleet:
            seen = self._fits[key] = (fleet, compute())
        return seen[1]

    def screen(self, kind: Hashable | None, compute: Callable[[], T]) -> T:
        if kind is None:
            return compute()
        if kind not in self._screens:
            self._screens[kind] = compute()
        value: T = self._screens[kind]  # type: ignore[assignment]  # stored by this same call site's type
        return value

    # ---- what depends on the ledger ----------------------------------------------------------------
    def no_room(self, fleet: FleetSlot, kind: Hashable | None, version: tuple[int, ...]) -> str | None:
        """Why a gang of ``kind`` did not fit ``fleet`` at the ledger's ``version`` for it (None: not
        tried at that version, or it fitted)."""
        if kind is None:
            return None
        seen = self._no_room.get((id(fleet), kind))
        return seen[2] if seen is not None and seen[0] is fleet and seen[1] == version else None

    def remember_no_room(self, fleet: FleetSlot, kind: Hashable | None, version: tuple[int, ...], why: str) -> None:
        if kind is not None:
            self._no_room[(id(fleet), kind)] = (fleet, version, why)

    def full_fleets(self, kind: Hashable | None) -> set[str]:
        """The fleets a gang of ``kind`` did not fit earlier in the pass (add to it): capacity only goes
        down within a pass, so they stay full for that kind."""
        if kind is None:
            return set()
        return self._full.setdefault(kind, set())

    def blockers(self, kind: Hashable | None, version: int, held: int) -> list[str] | None:
        """What stopped a gang of ``kind`` in every fleet, at the ledger's ``version`` with ``held``
        fleets held (None: not tried then)."""
        if kind is None:
            return None
        seen = self._blockers.get(kind)
        return seen[2] if seen is not None and seen[:2] == (version, held) else None

    def remember_blockers(self, kind: Hashable | None, version: int, held: int, blockers: list[str]) -> None:
        if kind is not None:
            self._blockers[kind] = (version, held, blockers)

    def waited_without_room(self, kind: Hashable | None, reach: Sequence[FleetSlot] | None = None) -> None:
        """A gang of ``kind`` fitted no fleet and was told to wait (freeing nothing for itself); ``reach``: the
        fleets it could ever run in, where it waited for capacity (not for its quota)."""
        if kind is not None:
            self._roomless.add(kind)
            if reach is not None and kind not in self._reach:
                self._reach[kind] = frozenset(f.id for f in reach)

    def reach(self, kind: Hashable) -> frozenset[str] | None:
        """The ids of the fleets a gang of ``kind`` could ever run in, once one waited for capacity in the pass
        (None: none did)."""
        return self._reach.get(kind)

    @property
    def kinds_without_room(self) -> int:
        """How many kinds of gang found no room so far in the pass (it only grows)."""
        return len(self._roomless)

    def found_no_room(self, kind: Hashable) -> bool:
        """Whether a gang of ``kind`` fitted no fleet and waited earlier in the pass: capacity only goes down
        within a pass, so every later gang of the kind fits none either."""
        return kind in self._roomless


def stable_kind(jobs: Sequence[QueuedJob]) -> StableKind | None:
    """:meth:`PassMemo.gang_kind` with each job's requirements themselves instead of a pass's numbers for them:
    the same for two gangs in any pass, so a queue kept across passes can count its kinds
    (``queue_order.QueueOrder``); None for a gang with ``instances`` selectors."""
    head = jobs[0]
    if head.selectors is not None:
        return None
    shapes = tuple((j.requirements, j.multinode, j.nodes, j.job_num) for j in jobs)
    return (head.project_id, head.project_name, head.fleet_names, view_key(head), head.creation_policy, shapes)
