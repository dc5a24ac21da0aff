"""The room a preemption decision works in (pure): trial snapshots with what jobs hold given back
(``freed``) or what a plan assigns taken (``booked``), the gangs a plan leaves waiting, and the blocks
promised to waiting preemptors (``held``) that no other run's trial may count free."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from corral.domain.quotas import Usage, add, charge
from corral.domain.statuses import READY_INSTANCE
from corral.scheduler.holds import active as active_holds
from corral.scheduler.holds import preemptor
from corral.scheduler.types import (
    Assign,
    Fail,
    FleetSlot,
    InstanceSlot,
    Plan,
    ProjectQuota,
    QueuedJob,
    Reserve,
    Snapshot,
)


@dataclass(frozen=True)
class RunningJob:
    """A job that holds capacity: on ``instance_id``, ``blocks`` of it, holding ``usage``."""

    id: str
    run_id: str
    run_name: str
    project_id: str
    priority: int
    #: When it started (the victim order and ``min_runtime`` use the latest start of its gang).
    started_at: float
    #: Its run's configuration type: ``task``, ``service``, ``dev-environment``.
    run_type: str
    instance_id: str
    blocks: int
    usage: Mapping[str, float] = field(default_factory=dict)
    replica_num: int = 0
    #: A stop was asked for (by a user, the server, or an earlier preemption): it frees its capacity soon.
    stopping: bool = False
    #: The stop message of a job preempted (:meth:`Preemption.message`: it names the preemptor).
    preempted_for: str | None = None


def waiting_gangs(snapshot: Snapshot, plan: Plan) -> list[tuple[QueuedJob, ...]]:
    """The gangs the plan leaves waiting, highest priority first, then oldest. A job that waits as it did
    has no decision (its message is unchanged): only a placement or a failure takes a gang out."""
    decided = {d.job_id for g in plan.gangs for d in g.decisions if isinstance(d, (Assign, Reserve, Fail))}
    gangs: dict[tuple[str, int], list[QueuedJob]] = {}
    for q in snapshot.queue:
        gangs.setdefault((q.run_id, q.replica_num), []).append(q)
    out = [tuple(js) for js in gangs.values() if not any(j.id in decided for j in js)]
    out.sort(key=lambda js: (-js[0].priority, min(j.submitted_at for j in js), js[0].run_id))
    return out


def held_for_preemptors(
    snapshot: Snapshot, plan: Plan, stopping: Sequence[RunningJob], now: float
) -> dict[str, dict[str, int]]:
    """The blocks promised to runs the plan does not place: run id -> instance -> blocks. Those of their
    holds (``scheduler.holds``: a victim that ended), and those a stopping job preempted for them will free
    (its stop message names the run, and its project when it is not the victim's). No other run may count
    them free, or it would wait for them instead of preempting for itself."""
    placed = {g.run_id for g in plan.gangs if any(isinstance(d, (Assign, Reserve)) for d in g.decisions)}
    own: dict[tuple[str, str], str] = {}
    named: dict[tuple[str, str], str] = {}
    for q in snapshot.queue:
        if q.run_id not in placed:
            own[(q.project_id, q.run_name)] = q.run_id
            named[(q.project_name or "", q.run_name)] = q.run_id
    out: dict[str, dict[str, int]] = {}

    def add_to(run_id: str, instance_id: str, blocks: int) -> None:
        mine = out.setdefault(run_id, {})
        mine[instance_id] = mine.get(instance_id, 0) + blocks

    for run_id, hs in active_holds(snapshot, now).items():
        if run_id not in placed:
            for h in hs:
                add_to(run_id, h.instance_id, h.blocks)
    for j in stopping:
        who = preemptor(j.preempted_for)
        if who is None:
            continue
        run = own.get((j.project_id, who[0])) if who[1] is None else named.get((who[1], who[0]))
        if run is not None:
            add_to(run, j.instance_id, j.blocks)
    return out


def freed_since(snapshot: Snapshot, busy_now: Mapping[str, int]) -> bool:
    """Whether an instance of ``snapshot`` has fewer busy blocks in ``busy_now`` (read later) than it had."""
    return any(i.busy_blocks > busy_now.get(i.id, i.busy_blocks) for f in snapshot.fleets for i in f.instances)


def held_for_others(work: Snapshot, held: Mapping[str, Mapping[str, int]], run_id: str) -> Snapshot:
    """The snapshot with the blocks ``held`` for runs other than ``run_id`` taken (what is free of them)."""
    others: dict[str, int] = {}
    for run, blocks in held.items():
        if run != run_id:
            for inst, n in blocks.items():
                others[inst] = others.get(inst, 0) + n
    if not others:
        return work
    return replace(work, fleets=tuple(_fleet_with(f, others, 1) for f in work.fleets))


def freed(snapshot: Snapshot, gone: Sequence[RunningJob]) -> Snapshot:
    """The snapshot with what ``gone`` hold given back: their blocks, and their usage against quotas."""
    if not gone:
        return snapshot
    blocks: dict[str, int] = {}
    for j in gone:
        blocks[j.instance_id] = blocks.get(j.instance_id, 0) + j.blocks
    fleets = tuple(_fleet_with(f, blocks, -1) for f in snapshot.fleets)
    quotas = dict(snapshot.quotas)
    for j in gone:
        q = quotas.get(j.project_id)
        if q is not None:
            quotas[j.project_id] = ProjectQuota(q.max, minus(q.used, j.usage), q.instance_ids, q.project_name)
    return replace(snapshot, fleets=fleets, quotas=quotas)


def booked(snapshot: Snapshot, plan: Plan) -> Snapshot:
    """The snapshot with the blocks the plan assigns taken."""
    blocks: dict[str, int] = {}
    for d in (d for g in plan.gangs for d in g.decisions):
        if isinstance(d, Assign):
            blocks[d.instance_id] = blocks.get(d.instance_id, 0) + d.blocks
    if not blocks:
        return snapshot
    return replace(snapshot, fleets=tuple(_fleet_with(f, blocks, 1) for f in snapshot.fleets))


def _fleet_with(f: FleetSlot, blocks: Mapping[str, int], sign: int) -> FleetSlot:
    if not any(i.id in blocks for i in f.instances):
        return f
    return replace(f, instances=tuple(_instance_with(i, sign * blocks.get(i.id, 0)) for i in f.instances))


def _instance_with(i: InstanceSlot, delta: int) -> InstanceSlot:
    if delta == 0:
        return i
    busy = min(i.total_blocks, max(0, i.busy_blocks + delta))
    status = i.status
    if status in READY_INSTANCE:
        status = "busy" if busy > 0 else "idle"
    return replace(i, busy_blocks=busy, status=status)


def charge_of(work: Snapshot, plan: Plan) -> Usage:
    by_id = {i.id: i for f in work.fleets for i in f.instances}
    out: Usage = {}
    for d in (d for g in plan.gangs for d in g.decisions):
        inst = by_id.get(d.instance_id) if isinstance(d, Assign) else None
        if inst is None or inst.resources is None or not isinstance(d, Assign):
            continue
        r = inst.resources
        out = add(out, charge([g.name for g in r.gpus], r.cpus, r.memory_mib, inst.price, d.blocks, inst.total_blocks))
    return out


def minus(a: Mapping[str, float], b: Mapping[str, float]) -> Usage:
    out = dict(a)
    for k, v in b.items():
        out[k] = max(0.0, out.get(k, 0.0) - v)
    return out
