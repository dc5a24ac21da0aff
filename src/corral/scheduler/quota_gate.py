"""Hard quotas in the pure pass: what a gang's placement would charge its project (GPUs per model of the
instance or offer it lands on, CPUs, memory, price, new instances) and whether that keeps the project
within its ``quota.max`` (``Snapshot.quotas``), counting what gangs earlier in the pass took.

A gang that would go above the max waits with a message naming the quota; one whose placement alone
(with nothing else held) exceeds it fails at once. A gang that fits no fleet now waits for the quota
rather than for capacity when no placement could keep its project within the max anyway (``at_max``).
``store.plan_apply`` checks the same sums again from the database, under a per-project lock, in the
transaction that commits the plan. Pure: imports only ``corral.domain``, the scheduler's types and its pass memo.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from corral.domain.quotas import GPU_MODEL_PREFIX, Limits, Usage, add, charge, exceeded, label
from corral.domain.resources import InstanceResources, Requirements
from corral.scheduler.pass_memo import PassMemo
from corral.scheduler.types import Assign, Decision, FleetSlot, InstanceSlot, ProjectQuota, QueuedJob, Reserve, Snapshot

QUOTA_WAIT_PREFIX = "Waiting for quota"


@dataclass
class QuotaBook:
    """What each project with a quota holds, as the pass goes (starts from the snapshot)."""

    snapshot: Snapshot
    used: dict[str, Usage] = field(default_factory=dict)
    on: dict[str, set[str]] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    _instances: dict[str, InstanceSlot] | None = None

    def version(self, project_id: str) -> int:
        """Bumped each time the project takes capacity in the pass."""
        return self.versions.get(project_id, 0)

    def instance(self, instance_id: str) -> InstanceSlot | None:
        if self._instances is None:
            self._instances = {i.id: i for f in self.snapshot.fleets for i in f.instances}
        return self._instances.get(instance_id)

    def quota(self, project_id: str) -> ProjectQuota | None:
        return self.snapshot.quotas.get(project_id)

    def holding(self, project_id: str) -> tuple[Usage, set[str]]:
        q = self.snapshot.quotas[project_id]
        if project_id not in self.used:
            self.used[project_id] = dict(q.used)
            self.on[project_id] = set(q.instance_ids)
        return self.used[project_id], self.on[project_id]


def _resources_charge(res: InstanceResources | None, price: float, blocks: int, total: int) -> Usage:
    if res is None:
        return {}
    return charge([g.name for g in res.gpus], res.cpus, res.memory_mib, price, blocks, total)


def gang_charge(decisions: Sequence[Decision], book: QuotaBook, held_on: set[str]) -> tuple[Usage, set[str]]:
    """What the decisions would add to the project's usage, and the instances they would newly hold."""
    total: Usage = {}
    new_on: set[str] = set()
    instances = 0
    for d in decisions:
        if isinstance(d, Assign):
            inst = book.instance(d.instance_id)
            if inst is None:
                continue
            total = add(total, _resources_charge(inst.resources, inst.price, d.blocks, inst.total_blocks))
            if inst.id not in held_on and inst.id not in new_on:
                new_on.add(inst.id)
                instances += 1
        elif isinstance(d, Reserve) and d.job_id is not None:
            total = add(total, _resources_charge(d.offer.resources, d.offer.price, d.blocks, d.total_blocks))
            instances += 1
    if instances:
        total["instances"] = float(instances)
    return total, new_on


@dataclass(frozen=True)
class QuotaVerdict:
    message: str
    #: The placement alone exceeds the max: the gang can never run within it.
    never: bool


def check(project_id: str, decisions: Sequence[Decision], book: QuotaBook) -> QuotaVerdict | None:
    """None when the gang's placement keeps its project within ``quota.max`` (its charge is then booked),
    else why not."""
    quota = book.quota(project_id)
    if quota is None or quota.max.is_empty():
        return None
    used, on = book.holding(project_id)
    extra, new_on = gang_charge(decisions, book, on)
    over = exceeded(used, extra, quota.max)
    if over is None:
        book.used[project_id] = add(used, extra)
        on |= new_on
        book.versions[project_id] = book.version(project_id) + 1
        return None
    where = f" in project {quota.project_name}" if quota.project_name else ""
    alone = exceeded({}, extra, quota.max)
    if alone is not None:
        dim = alone.split(" 0/")[0] if " 0/" in alone else alone
        need = _need(extra, quota, dim)
        return QuotaVerdict(f"The run exceeds the quota of the project on its own: it needs {need}{where}", never=True)
    return QuotaVerdict(f"{QUOTA_WAIT_PREFIX}: {over}{where}", never=False)


def at_max(
    jobs: Sequence[QueuedJob], kind: Hashable | None, fleets: Sequence[FleetSlot], book: QuotaBook, memo: PassMemo
) -> QuotaVerdict | None:
    """Why a gang that fits none of ``fleets`` now would wait for its project's quota even with every fleet
    free (None: capacity is what it waits for); once per kind of gang and what its project holds."""
    quota = book.quota(jobs[0].project_id)
    if quota is None or quota.max.is_empty():
        return None
    key = _at_max_key(jobs, kind, book) if kind is not None else None
    if key is not None and key in memo.quota_refused:
        seen = memo.quota_refused[key]
        assert seen is None or isinstance(seen, QuotaVerdict)
        return seen
    verdict = _at_max(jobs, gpu_models(fleets), book)
    if key is not None:
        memo.quota_refused[key] = verdict
    return verdict


def known_at_max(jobs: Sequence[QueuedJob], kind: Hashable, book: QuotaBook, memo: PassMemo) -> bool | None:
    """Whether ``at_max`` told a gang of ``kind`` to wait for its project's quota at what the project holds now
    (None: it was not asked at that holding in this pass)."""
    quota = book.quota(jobs[0].project_id)
    if quota is None or quota.max.is_empty():
        return False
    seen = memo.quota_refused.get(_at_max_key(jobs, kind, book), False)
    if seen is False:
        return None
    return isinstance(seen, QuotaVerdict)


def _at_max_key(jobs: Sequence[QueuedJob], kind: Hashable, book: QuotaBook) -> Hashable:
    """Where ``at_max``'s verdict for a gang of ``kind`` is kept in the pass's memo: at what its project holds now."""
    return ("at max", kind, book.version(jobs[0].project_id))


def gpu_models(fleets: Sequence[FleetSlot]) -> frozenset[str]:
    """The GPU models of the instances and offers of ``fleets``."""
    return frozenset(
        g.name.upper()
        for f in fleets
        for res in [*(i.resources for i in f.instances), *(o.resources for o in f.offers)]
        if res is not None
        for g in res.gpus
    )


def _at_max(jobs: Sequence[QueuedJob], models: frozenset[str], book: QuotaBook) -> QuotaVerdict | None:
    """The GPUs the gang asks for at least are above what the max leaves of GPUs of any model, or of each
    of the ``models`` (``gpu_models`` of its fleets) it may get."""
    head = jobs[0]
    quota = book.quota(head.project_id)
    gpu = head.requirements.gpu
    if quota is None or quota.max.is_empty() or gpu is None or not gpu.count.min:
        return None
    used, _on = book.holding(head.project_id)
    least = float(sum(j.requirements.gpu.count.min or 0 for j in jobs if j.requirements.gpu is not None))
    over = exceeded(used, {"gpu": least}, quota.max)
    if over is None:
        names = {n.upper() for n in gpu.names} if gpu.names else None
        blocked = [
            exceeded(used, {GPU_MODEL_PREFIX + m: least}, quota.max)
            for m in sorted(models)
            if names is None or m in names
        ]
        over = blocked[0] if blocked and all(blocked) else None
    if over is None:
        return None
    where = f" in project {quota.project_name}" if quota.project_name else ""
    return QuotaVerdict(f"{QUOTA_WAIT_PREFIX}: {over}{where}", never=False)


def _need(extra: Usage, quota: ProjectQuota, dim_label: str) -> str:
    """``"<dimension> <amount> but quota.max allows <cap>"`` for a dimension of ``quota.max`` named by its label."""
    dim, cap = next((d, c) for d, c in quota.max.amounts.items() if label(d) == dim_label)
    return f"{dim_label} {extra.get(dim, 0.0):g} but quota.max allows {cap:g}"


def request_exceeds(req: Requirements, nodes: int, limits: Limits) -> str | None:
    """What the least a run can be given (``nodes`` jobs of ``req`` each) takes beyond ``limits`` on its
    own, as ``"gpu 16 but quota.max allows 8"``; None when it could fit within them. ``runs/apply`` refuses
    such a run at once."""
    if limits.is_empty():
        return None
    least: dict[str, float] = {"cpu": float(req.cpu_count.min or 0) * nodes, "instances": float(nodes)}
    least["memory"] = float(req.memory.min or 0.0) * nodes
    gpus = req.gpu.count.min if req.gpu is not None and req.gpu.count.min else 0
    if gpus:
        least["gpu"] = float(gpus * nodes)
    for dim in ("gpu", "cpu", "memory", "instances"):
        cap = limits.get(dim)
        if cap is not None and least.get(dim, 0.0) > cap + 1e-9:
            return f"{dim} {least[dim]:g} but quota.max allows {cap:g}"
    names = req.gpu.names if req.gpu is not None else None
    if gpus and names:
        caps = [limits.get(GPU_MODEL_PREFIX + n.upper()) for n in names]
        if all(c is not None and gpus * nodes > c + 1e-9 for c in caps):
            allowed = ", ".join(f"{n.upper()} {c:g}" for n, c in zip(names, caps, strict=True) if c is not None)
            return f"gpu {gpus * nodes:g} of {'/'.join(n.upper() for n in names)} but quota.max allows {allowed}"
    return None
