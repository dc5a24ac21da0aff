"""``schedule(snapshot, now) -> Plan``: the pure placement decision.

Jobs are taken in queue order (priority, higher first; then submission time). The jobs of one run form
a gang placed in a single fleet together or not at all. For each gang the scheduler prefers free blocks
of existing instances (cheapest first), then new instances of a fleet under its ``nodes.max``; a gang
that could run once capacity frees waits (if its retry policy lets it), and one that no fleet can
ever hold fails at once with a message naming each fleet and why. Capacity taken by a gang earlier in
the order is not offered to later ones, so a lower-priority job never takes what a higher one can use
now, while a higher job that cannot fit anywhere does not block lower ones that fit elsewhere.

A new instance carved out of a shared host (the local machine, ``Snapshot.host_pools``) is reserved only
while that host has the blocks free; idle instances holding blocks a waiting gang needs are reclaimed
(``Reclaim``) when that is enough. A waiting gang's message names, fleet by fleet, what stops it now:
busy instances, ``nodes.max``, the backend's instance cap, the host's free blocks, a fleet held for an
earlier job. ``refusal`` is the verdict ``runs/get_plan`` shows: exactly the failures ``schedule`` makes at
once whatever the capacity.

The plan is optimistic: ``store.plan_apply`` recounts under locks and rejects what no longer fits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from corral.domain.resources import InstanceResources, Requirements, match_requirements
from corral.domain.selectors import FleetRef, InstanceIdentity, Selector, matches
from corral.scheduler.blocks import blocks_needed, total_blocks_for
from corral.scheduler.fleet_view import WIRE_NAMES, as_job_sees_it
from corral.scheduler.types import (
    Assign,
    Decision,
    Fail,
    FleetSlot,
    Gang,
    InstanceSlot,
    Offer,
    Plan,
    QueuedJob,
    Reclaim,
    Reserve,
    Snapshot,
    Wait,
)

# Starts as dstack's does: its clients (and dstack's server) show such a job's status as "no fleets".
NO_FLEETS_MESSAGE = (
    "No matching fleet found: no fleet of this project can run this job (there is none, or none has the "
    "resources it asks for). Apply a fleet first, e.g. `corral apply -f examples/fleet.dstack.yml` (one on "
    "this machine), then submit the run again; `corral fleet -v` shows the fleets there are."
)
SPECIFIED_FLEETS_MESSAGE = "Failed to use specified fleets"
_USABLE_STATUSES = frozenset({"pending", "provisioning", "idle", "busy"})


@dataclass
class _Ledger:
    """Capacity as this pass has used it so far."""

    free_blocks: dict[str, int] = field(default_factory=dict)
    fleet_count: dict[str, int] = field(default_factory=dict)
    backend_used: dict[str, int] = field(default_factory=dict)
    host_used: dict[str, int] = field(default_factory=dict)

    def copy(self) -> _Ledger:
        return _Ledger(dict(self.free_blocks), dict(self.fleet_count), dict(self.backend_used), dict(self.host_used))


def _initial_ledger(snapshot: Snapshot) -> _Ledger:
    ledger = _Ledger()
    for fleet in snapshot.fleets:
        ledger.fleet_count[fleet.id] = len(fleet.instances)
        for inst in fleet.instances:
            ledger.free_blocks[inst.id] = max(0, inst.total_blocks - inst.busy_blocks)
    for key, (used, _limit) in snapshot.backend_limits.items():
        ledger.backend_used[key] = used
    for backend, (used, _total) in snapshot.host_pools.items():
        ledger.host_used[backend] = used
    return ledger


def _fleet_ref(text: str) -> FleetRef:
    project, _, name = text.rpartition("/")
    return FleetRef(name, project or None)


def _candidate_fleets(job: QueuedJob, fleets: Iterable[FleetSlot]) -> list[FleetSlot]:
    """The job's project's fleets and those exported to it, narrowed by the ``fleets`` option."""
    visible = [f for f in fleets if f.project_id == job.project_id or job.project_id in f.importer_project_ids]
    visible = [as_job_sees_it(job, f) for f in visible]
    if job.fleet_names is None:
        return visible
    refs = [_fleet_ref(n) for n in job.fleet_names]
    return [f for f in visible if any(r.matches(f.name, f.project_name, job.project_name) for r in refs)]


def _apply_selectors(job: QueuedJob, fleets: list[FleetSlot]) -> tuple[list[FleetSlot], list[Selector]]:
    """Fleets reduced to the instances the ``instances`` option allows (and no offers: nothing new is
    ever provisioned for such a job), and the selectors that match no instance at all."""
    assert job.selectors is not None
    unmatched: list[Selector] = []
    allowed: set[str] = set()
    for sel in job.selectors:
        hits = {
            i.id
            for f in fleets
            for i in f.instances
            if i.status != "terminated"
            and matches(
                sel, InstanceIdentity(i.name, i.instance_num, f.name, f.project_name, i.addresses), job.project_name
            )
        }
        if not hits:
            unmatched.append(sel)
        allowed |= hits
    reduced = []
    for f in fleets:
        insts = f.instances if not job.selectors else tuple(i for i in f.instances if i.id in allowed)
        reduced.append(replace(f, instances=insts, offers=()))
    return reduced, unmatched


def _instance_usable(inst: InstanceSlot) -> bool:
    return inst.status in _USABLE_STATUSES and not inst.unreachable and inst.resources is not None


def _never_fits_reason(fleet: FleetSlot, job: QueuedJob, reuse_only: bool) -> str | None:
    """Why ``job`` can never run in ``fleet`` (None if it could, once capacity frees)."""
    if job.multinode and fleet.placement != "cluster":
        return "multi-node tasks need a fleet with `placement: cluster`"
    if fleet.nodes_max is not None and fleet.nodes_max < job.nodes:
        return f"the run needs {job.nodes} nodes but nodes.max is {fleet.nodes_max}"
    reasons: list[str] = []
    for inst in fleet.instances:
        if inst.status not in _USABLE_STATUSES:
            continue
        if inst.resources is None:  # a host being set up (SSH fleets): what it has is not known yet
            return None
        if blocks_needed(job.requirements, inst.resources, inst.total_blocks) is not None:
            return None
        reasons.append(_why(job.requirements, inst.resources, inst.total_blocks))
    if not reuse_only and (fleet.nodes_max is None or fleet.nodes_max > 0):
        offer_reasons = []
        for offer in fleet.offers:
            total = total_blocks_for(fleet.blocks, offer.resources)
            if blocks_needed(job.requirements, offer.resources, total) is not None:
                return None
            offer_reasons.append(_why(job.requirements, offer.resources, total))
        # offers of a host carved into blocks come smallest first: the largest one says what is missing
        reasons.extend(reversed(offer_reasons))
    if reuse_only and not fleet.instances:
        return "it has no instances and `creation_policy: reuse` allows no new ones"
    if not reasons and fleet.priced_out is not None and job.max_price is not None:
        return f"its offers cost ${fleet.priced_out:g}/h or more, above the run's `max_price` (${job.max_price:g}/h)"
    if not reasons and fleet.unlisted_backends:
        names = ", ".join(sorted({WIRE_NAMES.get(b, b) for b in fleet.unlisted_backends if b}))
        return f"the run's `backends` does not list its backends ({names})"
    if not reasons and fleet.withheld_backends:
        names = ", ".join(sorted(fleet.withheld_backends))
        return (
            f"its {names} instances run jobs without a sandbox on this server, so only global admins' runs may"
            " use them (set an `image` to run in a container)"
        )
    if not reasons:
        return "it has no instances and cannot create any"
    return reasons[0]


def _why(req: Requirements, res: InstanceResources, total_blocks: int) -> str:
    reason = match_requirements(req, res)
    if reason is None and total_blocks > 1:
        return f"not even all {total_blocks} blocks of an instance are enough"
    return reason or "does not match"


def _try_place_in_fleet(
    jobs: list[QueuedJob], fleet: FleetSlot, ledger: _Ledger, snapshot: Snapshot
) -> tuple[list[Decision], bool] | str:
    """Place every job of the gang in ``fleet`` using ``ledger`` (mutated). Returns the decisions and
    whether new instances were needed, or what stops the gang from fitting now (the real constraint:
    busy instances, ``nodes.max``, the backend's instance cap, the host's free blocks)."""
    decisions: list[Decision] = []
    used_new = False
    reuse_only = jobs[0].creation_policy == "reuse" or jobs[0].selectors is not None
    if _distinct_requirements(jobs[0], jobs):
        # node groups: the jobs that fit the fewest instances choose first (the cheapest-first choice
        # would let a CPU node take the only GPU host its GPU sibling needs)
        fits = {
            j.id: sum(
                1
                for i in fleet.instances
                if i.resources is not None and blocks_needed(j.requirements, i.resources, i.total_blocks) is not None
            )
            for j in jobs
        }
        jobs = sorted(jobs, key=lambda j: (fits[j.id], j.job_num))
    taken: set[str] = set()
    gang = f" (the run needs {len(jobs)} nodes at once)" if len(jobs) > 1 else ""
    limits = snapshot.backend_limits
    for job in jobs:
        placed = False
        candidates = sorted(
            (i for i in fleet.instances if _instance_usable(i) and i.id not in taken),
            key=lambda i: (i.status != "idle", i.price, i.instance_num),
        )
        for inst in candidates:
            assert inst.resources is not None
            need = blocks_needed(job.requirements, inst.resources, inst.total_blocks)
            if need is None or ledger.free_blocks.get(inst.id, 0) < need:
                continue
            ledger.free_blocks[inst.id] -= need
            decisions.append(Assign(job.id, inst.id, need))
            if job.multinode:
                taken.add(inst.id)
            placed = True
            break
        if placed:
            continue
        if reuse_only:
            if job.selectors is not None:
                return f"fleet '{fleet.name}': the instances `instances` selects are busy{gang}"
            return f"fleet '{fleet.name}': its instances are busy and `creation_policy: reuse` allows no new ones{gang}"
        count = ledger.fleet_count.get(fleet.id, 0)
        if fleet.nodes_max is not None and count >= fleet.nodes_max:
            return (
                f"fleet '{fleet.name}' has {len(fleet.instances)} of at most {fleet.nodes_max} instances, "
                f"none free{gang}"
            )
        key = fleet.backend_limit_key
        if key is not None and key in limits and ledger.backend_used.get(key, 0) >= limits[key][1]:
            return f"fleet '{fleet.name}': the {key} backend has reached its limit of {limits[key][1]} instances{gang}"
        host_short: str | None = None
        for offer in sorted(fleet.offers, key=lambda o: o.price):
            total = total_blocks_for(fleet.blocks, offer.resources)
            need = blocks_needed(job.requirements, offer.resources, total)
            if need is None:
                continue
            pool = snapshot.host_pools.get(offer.backend) if offer.host_blocks else None
            if pool is not None:
                free = pool[1] - ledger.host_used.get(offer.backend, 0)
                if offer.host_blocks > free:
                    if host_short is None:
                        host_short = (
                            f"fleet '{fleet.name}': this machine has {max(0, free)} of its {pool[1]} blocks free "
                            f"and a {offer.backend} instance for the job needs {offer.host_blocks}{gang}"
                        )
                    continue
                ledger.host_used[offer.backend] = ledger.host_used.get(offer.backend, 0) + offer.host_blocks
            ledger.fleet_count[fleet.id] = count + 1
            if key is not None:
                ledger.backend_used[key] = ledger.backend_used.get(key, 0) + 1
            decisions.append(Reserve(fleet.id, offer, need, total, job_id=job.id))
            used_new = True
            placed = True
            break
        if not placed:
            return host_short or f"fleet '{fleet.name}' has no free instance{gang}"
    return decisions, used_new


def _unknown_fleets_message(job: QueuedJob, fleets: Iterable[FleetSlot]) -> str:
    visible = sorted(
        f.name for f in fleets if f.project_id == job.project_id or job.project_id in f.importer_project_ids
    )
    names = ", ".join(f"'{n}'" for n in job.fleet_names or ())
    where = f" in project '{job.project_name}'" if job.project_name else ""
    known = f"its fleets: {', '.join(visible)}" if visible else "it has no fleets"
    return f"{SPECIFIED_FLEETS_MESSAGE}: no fleet named {names}{where} ({known})"


def _screen(head: QueuedJob, snapshot: Snapshot, gang: Sequence[QueuedJob] = ()) -> tuple[list[FleetSlot], bool] | str:
    """The fleets the gang headed by ``head`` could ever run in (and whether it may only reuse existing
    instances), or the message it fails with at once: no fleet, unknown ``fleets``, a selector matching
    nothing, or nothing it could ever fit in. The other jobs of a gang whose nodes differ (node
    ``groups``) must each fit the fleet too."""
    candidates = _candidate_fleets(head, snapshot.fleets)
    if not candidates and head.selectors:
        return "Failed to use specified instances: no instance matches " + "; ".join(str(x) for x in head.selectors)
    if not candidates:
        if head.fleet_names is not None:
            return _unknown_fleets_message(head, snapshot.fleets)
        return NO_FLEETS_MESSAGE
    reuse_only = head.creation_policy == "reuse" or head.selectors is not None
    if head.selectors is not None:
        candidates, unmatched = _apply_selectors(head, candidates)
        if unmatched:
            return "Failed to use specified instances: no instance matches " + "; ".join(str(u) for u in unmatched)
    feasible: list[FleetSlot] = []
    reasons: list[str] = []
    others = _distinct_requirements(head, gang)
    for fleet in candidates:
        reason = _never_fits_reason(fleet, head, reuse_only)
        for job in others:
            if reason is None and (why := _never_fits_reason(fleet, job, reuse_only)) is not None:
                reason = f"job {job.job_num}: {why}"
        if reason is None:
            feasible.append(fleet)
        else:
            reasons.append(f"fleet '{fleet.name}': {reason}")
    if not feasible:
        return "No fleet can ever run this job: " + "; ".join(reasons)
    return feasible, reuse_only


def _distinct_requirements(head: QueuedJob, gang: Sequence[QueuedJob]) -> list[QueuedJob]:
    """One job of the gang for each requirement other than the head's (in job order)."""
    seen = [head.requirements]
    out = []
    for job in gang:
        if job.requirements not in seen:
            seen.append(job.requirements)
            out.append(job)
    return out


def screen(job: QueuedJob, snapshot: Snapshot) -> tuple[list[FleetSlot], bool] | str:
    """The fleets a run whose first job is ``job`` could ever run in and whether it may only reuse existing
    instances (what ``schedule`` chooses among), or the message it fails with at once."""
    return _screen(job, snapshot)


def refusal(job: QueuedJob, snapshot: Snapshot) -> str | None:
    """Why a run whose first job is ``job`` would fail at once if submitted now (what ``schedule`` fails it
    with), or None if it can run now or once capacity frees. ``runs/get_plan`` shows it before ``apply``."""
    screened = _screen(job, snapshot)
    return screened if isinstance(screened, str) else None


def _schedule_gang(
    jobs: list[QueuedJob], snapshot: Snapshot, ledger: _Ledger, now: float, held: set[str]
) -> tuple[list[Decision], _Ledger]:
    head = jobs[0]
    screened = _screen(head, snapshot, jobs)
    if isinstance(screened, str):
        return [Fail(j.id, screened) for j in jobs], ledger
    feasible, reuse_only = screened

    best: tuple[tuple[bool, float], list[Decision], _Ledger] | None = None
    blockers: list[str] = []
    for fleet in feasible:
        if fleet.id in held:
            blockers.append(f"fleet '{fleet.name}' is held for an earlier job that has waited long")
            continue
        trial = ledger.copy()
        placed = _try_place_in_fleet(jobs, fleet, trial, snapshot)
        if isinstance(placed, str):
            blockers.append(placed)
            continue
        decisions, used_new = placed
        price = min((o.price for o in fleet.offers), default=0.0) if used_new else 0.0
        key = (used_new, price)
        if best is None or key < best[0]:
            best = (key, decisions, trial)
    if best is not None:
        return best[1], best[2]

    if not head.wait.may_wait:
        msg = "Could not reuse any instance for this job" if reuse_only else "Fleet is at capacity"
        return [Fail(j.id, f"{msg}: {'; '.join(blockers)}") for j in jobs], ledger
    if head.wait.deadline is not None and now >= head.wait.deadline:
        return [Fail(j.id, "Waited for capacity until the retry duration ran out") for j in jobs], ledger
    if all(f.id in held for f in feasible):
        message = "Waiting for capacity: an earlier job that has waited long holds the fleets this job can use"
    else:
        message = "Waiting for capacity: " + "; ".join(blockers)
    if snapshot.hold_after is not None and now - head.submitted_at >= snapshot.hold_after:
        held.update(f.id for f in feasible)
    reclaims = _reclaim_for(jobs, feasible, snapshot, ledger)
    if reclaims:
        message = "Waiting for capacity: freeing idle instances of this machine for this job"
    waits: list[Decision] = [Wait(j.id, message) for j in jobs if j.status_message != message]
    return [*reclaims, *waits], ledger


def _reclaim_for(jobs: list[QueuedJob], fleets: list[FleetSlot], snapshot: Snapshot, ledger: _Ledger) -> list[Decision]:
    """Idle instances to terminate so that the host they were carved out of can hold the gang's new
    instances (the local machine), when that is what stops it -- and when they are enough. Their blocks
    are taken from the ledger: nothing later in this pass is placed on them."""
    if jobs[0].creation_policy == "reuse" or jobs[0].selectors is not None:
        return []
    for fleet in fleets:
        if fleet.nodes_max is not None and ledger.fleet_count.get(fleet.id, 0) + len(jobs) > fleet.nodes_max:
            continue
        for offer in sorted(fleet.offers, key=lambda o: (o.price, o.host_blocks)):
            pool = snapshot.host_pools.get(offer.backend) if offer.host_blocks else None
            if pool is None:
                continue
            total = total_blocks_for(fleet.blocks, offer.resources)
            if any(blocks_needed(j.requirements, offer.resources, total) is None for j in jobs):
                continue
            need = offer.host_blocks * len(jobs) - (pool[1] - ledger.host_used.get(offer.backend, 0))
            idle = sorted(
                (
                    i
                    for f in snapshot.fleets
                    if len(f.instances) > f.nodes_min
                    for i in f.instances
                    if i.backend == offer.backend
                    and i.host_blocks
                    and i.status == "idle"
                    and i.busy_blocks == 0
                    and ledger.free_blocks.get(i.id, 0) >= i.total_blocks
                ),
                key=lambda i: -i.host_blocks,
            )
            if need <= 0 or sum(i.host_blocks for i in idle) < need:
                continue
            out: list[Decision] = []
            for inst in idle:
                if need <= 0:
                    break
                ledger.free_blocks[inst.id] = 0
                need -= inst.host_blocks
                out.append(Reclaim(inst.id, f"Terminated to free this machine for run {jobs[0].run_name}"))
            return out
    return []


def schedule(snapshot: Snapshot, now: float) -> Plan:
    ledger = _initial_ledger(snapshot)
    gangs: dict[tuple[str, int], list[QueuedJob]] = {}
    order = sorted(snapshot.queue, key=lambda j: (-j.priority, j.submitted_at, j.run_id, j.replica_num, j.job_num))
    for job in order:
        gangs.setdefault((job.run_id, job.replica_num), []).append(job)
    out: list[Gang] = []
    held: set[str] = set()
    for (run_id, _replica), jobs in gangs.items():
        decisions, ledger = _schedule_gang(jobs, snapshot, ledger, now, held)
        if decisions:
            out.append(Gang(run_id, tuple(decisions)))
    return Plan(tuple(out))


def upkeep(fleet: FleetSlot, host_free: dict[str, int] | None = None) -> list[Reserve]:
    """Reservations that bring ``fleet`` up to ``nodes.min`` (through the same commit point). An offer
    carved out of a host is reserved only while ``host_free`` (backend -> free blocks; mutated) has room."""
    missing = fleet.nodes_min - len(fleet.instances)
    if missing <= 0 or not fleet.offers:
        return []
    offer: Offer = min(fleet.offers, key=lambda o: o.price)
    total = total_blocks_for(fleet.blocks, offer.resources)
    out: list[Reserve] = []
    for _ in range(missing):
        if offer.host_blocks and host_free is not None and offer.backend in host_free:
            if host_free[offer.backend] < offer.host_blocks:
                break
            host_free[offer.backend] -= offer.host_blocks
        out.append(Reserve(fleet.id, offer, 0, total))
    return out
