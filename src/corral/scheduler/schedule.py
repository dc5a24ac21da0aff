"""``schedule(snapshot, now) -> Plan``: the pure placement decision.

Jobs are taken in queue order (priority, higher first; then submission time). The jobs of one run form a gang
placed in a single fleet together or not at all. For each gang the scheduler prefers free blocks of existing
instances (cheapest first), then new instances of a fleet under its ``nodes.max``; a gang that could run once
capacity frees waits (if its retry policy lets it), and one that no fleet can ever hold fails at once with a
message naming each fleet and why (:mod:`corral.scheduler.screening`). Capacity taken by a gang earlier in the
order is not offered to later ones, so a lower-priority job never takes what a higher one can use now, while a
higher job that cannot fit anywhere does not block lower ones that fit elsewhere.

A new instance carved out of a shared host (the local machine, ``Snapshot.host_pools``) is reserved only
while that host has the blocks free; idle instances holding blocks a waiting gang needs are reclaimed
(``Reclaim``) when that is enough. A waiting gang's message names, fleet by fleet, what stops it now:
busy instances, ``nodes.max``, the backend's instance cap, the host's free blocks, a fleet held for an
earlier job. ``refusal`` is the verdict ``runs/get_plan`` shows: exactly the failures ``schedule`` makes at
once whatever the capacity.

A gang whose placement would take its project above its ``quota.max`` (``Snapshot.quotas``,
:mod:`corral.scheduler.quota_gate`) takes nothing and waits with a message naming the quota, as does one
that fits nowhere now while its project has no GPUs left under the max for it; one that alone exceeds
the max fails at once. With ``Snapshot.shares`` the gangs of competing projects are taken
in fair-share order (:mod:`corral.scheduler.fair_share`) instead of queue order. Blocks a preemption
freed for a run that still waits (``Snapshot.holds``, :mod:`corral.scheduler.holds`) are kept out of
every other gang's reach; the runs they are held for are placed first.

The plan is optimistic: ``store.plan_apply`` recounts under locks and rejects what no longer fits.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from operator import attrgetter

from corral.scheduler.blocks import blocks_needed, takes_job, total_blocks_for
from corral.scheduler.fair_share import FairNote, ShareBook, fair_order, fair_order_of
from corral.scheduler.fallbacks import fallbacks
from corral.scheduler.fleet_upkeep import reclaim_for
from corral.scheduler.holds import Reserved, by_instance
from corral.scheduler.holds import active as active_holds
from corral.scheduler.ledger import Ledger, initial_ledger
from corral.scheduler.pass_memo import PassMemo
from corral.scheduler.quota_gate import QuotaBook, QuotaVerdict, at_max, known_at_max
from corral.scheduler.quota_gate import check as quota_check
from corral.scheduler.screening import (
    NO_FLEETS_MESSAGE,
    SPECIFIED_FLEETS_MESSAGE,
    candidate_fleets,
    distinct_requirements,
    instance_usable,
    refusal,
    screen,
    screen_gang,
)
from corral.scheduler.settled_skip import KindQueues, SettledSkip
from corral.scheduler.types import (
    Assign,
    Decision,
    Fail,
    FleetSlot,
    Gang,
    InstanceSlot,
    Plan,
    QueuedJob,
    Reserve,
    Snapshot,
    Wait,
)
from corral.scheduler.wait_repeat import RepeatWait

#: How the status message of a job the scheduler left in the queue for lack of room begins (a job that fits a
#: fleet's shape but finds it full); ``workers/service_scaling.py`` tells such a replica by it.
WAITING_FOR_CAPACITY = "Waiting for capacity"

__all__ = ["NO_FLEETS_MESSAGE", "SPECIFIED_FLEETS_MESSAGE", "WAITING_FOR_CAPACITY", "refusal", "schedule", "screen"]


def _placement_order(instances: Iterable[InstanceSlot]) -> list[InstanceSlot]:
    """The instances placement may use, in the order it tries them: idle first, then cheapest, oldest."""
    usable = (i for i in instances if instance_usable(i))
    return sorted(usable, key=lambda i: (i.status != "idle", i.price, i.instance_num))


def _try_place_in_fleet(  # noqa: C901, PLR0915
    jobs: list[QueuedJob], fleet: FleetSlot, ledger: Ledger, snapshot: Snapshot, memo: PassMemo
) -> tuple[list[Decision], bool] | str:
    """Place every job of the gang in ``fleet`` using ``ledger`` (mutated). Returns the decisions and
    whether new instances were needed, or what stops the gang from fitting now (the real constraint:
    busy instances, ``nodes.max``, the backend's instance cap, the host's free blocks)."""
    decisions: list[Decision] = []
    used_new = False
    reuse_only = jobs[0].creation_policy == "reuse" or jobs[0].selectors is not None
    if distinct_requirements(jobs[0], jobs):
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
        for inst in memo.ordered(fleet, _placement_order):
            if inst.id in taken or ledger.free_blocks.get(inst.id, 0) <= 0:
                continue
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
            need = (
                blocks_needed(job.requirements, offer.resources, total) if takes_job(job.requirements, offer) else None
            )
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
            others = fallbacks(offer, fleet.offers, fleet.blocks, need, total, job.requirements)
            decisions.append(Reserve(fleet.id, offer, need, total, job_id=job.id, fallbacks=others))
            used_new = True
            placed = True
            break
        if not placed:
            return host_short or f"fleet '{fleet.name}' has no free instance{gang}"
    return decisions, used_new


def _best_fleet(
    jobs: list[QueuedJob],
    kind: Hashable | None,
    feasible: list[FleetSlot],
    snapshot: Snapshot,
    ledger: Ledger,
    held: set[str],
    memo: PassMemo,
) -> tuple[tuple[list[Decision], Ledger] | None, list[str]]:
    """The gang placed in the best fleet (existing instances first, then the cheapest new ones) as the
    decisions and the trial that holds them, or what stops it in each fleet.

    Capacity only goes down within a pass, so a fleet a gang of this kind did not fit stays out of reach
    for the rest of the pass: it is skipped, and asked again only for the message when no fleet fits."""
    best: tuple[tuple[bool, float], list[Decision], Ledger] | None = None
    full = memo.full_fleets(kind)
    for fleet in feasible:
        if fleet.id in held:
            continue
        if fleet.id in full:
            continue
        trial = ledger.trial()
        placed = _try_place_in_fleet(jobs, fleet, trial, snapshot, memo)
        if isinstance(placed, str):
            full.add(fleet.id)
            memo.remember_no_room(fleet, kind, ledger.fleet_version(fleet, memo.host_backends(fleet)), placed)
            continue
        decisions, used_new = placed
        price = min((o.price for o in fleet.offers), default=0.0) if used_new else 0.0
        key = (used_new, price)
        if best is None or key < best[0]:
            best = (key, decisions, trial)
        if key == (False, 0.0):
            break  # existing instances: no later fleet can be strictly better
    if best is not None:
        return (best[1], best[2]), []
    # every fleet was tried or is known to be full: what stops the gang in each, in order
    blockers: list[str] = []
    for fleet in feasible:
        if fleet.id in held:
            blockers.append(f"fleet '{fleet.name}' is held for an earlier job that has waited long")
            continue
        version = ledger.fleet_version(fleet, memo.host_backends(fleet))
        why = memo.no_room(fleet, kind, version)
        if why is None:
            placed = _try_place_in_fleet(jobs, fleet, ledger.trial(), snapshot, memo)
            assert isinstance(placed, str), "a fleet a gang did not fit cannot fit it later in the pass"
            memo.remember_no_room(fleet, kind, version, placed)
            why = placed
        blockers.append(why)
    return None, blockers


def schedule_gang(  # noqa: C901, PLR0915
    jobs: list[QueuedJob],
    snapshot: Snapshot,
    ledger: Ledger,
    now: float,
    held: set[str],
    memo: PassMemo,
    book: QuotaBook | None = None,
    fair_note: Callable[[], str | None] | None = None,
    repeat: RepeatWait | None = None,
    context: tuple[int, int] = (0, 0),
) -> list[Decision]:
    """The gang's decisions; what it takes is committed into ``ledger`` (and charged in ``book``).
    ``fair_note`` says, for a gang that waits for capacity, which competing project went first; ``repeat``
    gives it the wait of an earlier gang of its kind where that is the same (``scheduler.wait_repeat``;
    ``context``: the shares' and the fair notes' versions)."""
    head = jobs[0]
    kind = memo.gang_kind(jobs)
    key: Hashable = None
    if repeat is not None and kind is not None:
        key = (ledger.version, len(held), book.version(head.project_id) if book is not None else 0, context)
        reused = repeat.reuse(kind, key, jobs, snapshot, now)
        if reused is not None:
            return reused
    screened = memo.screen(kind, lambda: screen_gang(head, snapshot, memo, jobs))
    if isinstance(screened, str):
        return [Fail(j.id, screened) for j in jobs]
    feasible, reuse_only = screened

    blockers = memo.blockers(kind, ledger.version, len(held))
    if blockers is None:
        version, held_count = ledger.version, len(held)
        # the same kind of gang, placed on the same capacity against the same holding, is refused alike
        refused_key = (kind, version, held_count, book.version(head.project_id)) if book and kind else None
        verdict = memo.quota_refused.get(refused_key) if refused_key is not None else None
        assert verdict is None or isinstance(verdict, QuotaVerdict)
        if verdict is None:
            best, blockers = _best_fleet(jobs, kind, feasible, snapshot, ledger, held, memo)
            if best is not None:
                verdict = quota_check(head.project_id, best[0], book) if book is not None else None
                if verdict is None:
                    ledger.commit(best[1])
                    return best[0]
                if refused_key is not None:
                    memo.quota_refused[refused_key] = verdict
        if verdict is not None:
            # above the project's quota.max: nothing taken, the capacity stays for later gangs
            if verdict.never:
                return [Fail(j.id, verdict.message) for j in jobs]
            if repeat is not None:
                repeat.remember(kind, key, verdict.message, capacity=False)
            return [Wait(j.id, verdict.message) for j in jobs if j.status_message != verdict.message]
        assert blockers is not None  # no fleet fit: _best_fleet said why
        memo.remember_blockers(kind, version, held_count, blockers)
    if book is not None:  # at its quota.max, more capacity would not start it: it waits for the quota
        capped = at_max(jobs, kind, feasible, book, memo)
        if capped is not None:
            memo.waited_without_room(kind)
            return [Wait(j.id, capped.message) for j in jobs if j.status_message != capped.message]

    if not head.wait.may_wait:
        freeing = _being_terminated(feasible)
        if freeing:  # capacity that is being freed now is not "no capacity": the job waits for it
            message = f"{WAITING_FOR_CAPACITY}: {freeing}"
            return [Wait(j.id, message) for j in jobs if j.status_message != message]
        msg = "Could not reuse any instance for this job" if reuse_only else "Fleet is at capacity"
        return [Fail(j.id, f"{msg}: {'; '.join(blockers)}") for j in jobs]
    if head.wait.deadline is not None and now >= head.wait.deadline:
        return [Fail(j.id, "Waited for capacity until the retry duration ran out") for j in jobs]
    if all(f.id in held for f in feasible):
        message = f"{WAITING_FOR_CAPACITY}: an earlier job that has waited long holds the fleets this job can use"
    else:
        note = fair_note() if fair_note is not None else None
        message = f"{WAITING_FOR_CAPACITY} ({note})" if note else WAITING_FOR_CAPACITY
        message += ": " + "; ".join(blockers)
    if snapshot.hold_after is not None and now - head.submitted_at >= snapshot.hold_after:
        held.update(f.id for f in feasible)
    reclaims = reclaim_for(jobs, feasible, snapshot, ledger)
    if reclaims:
        message = f"{WAITING_FOR_CAPACITY}: freeing idle instances of this machine for this job"
    else:
        memo.waited_without_room(kind, feasible)
        if repeat is not None:
            repeat.remember(kind, key, message, capacity=True, all_held=all(f.id in held for f in feasible))
    waits: list[Decision] = [Wait(j.id, message) for j in jobs if j.status_message != message]
    return [*reclaims, *waits]


def _being_terminated(feasible: list[FleetSlot]) -> str | None:
    """What of the fleets a job could use is being terminated (an instance given up, retired idle, or removed
    from its fleet): its place is free once it is gone; None if nothing is."""
    ending = [(f, i) for f in feasible for i in f.instances if i.status == "terminating"]
    if not ending:
        return None
    fleet, inst = ending[0]
    more = f" (and {len(ending) - 1} more)" if len(ending) > 1 else ""
    return f"instance {inst.name} of fleet '{fleet.name}' is being terminated{more}"


def _fleet_ids(job: QueuedJob, snapshot: Snapshot, memo: PassMemo) -> Callable[[], set[str]]:
    return lambda: {f.id for f in candidate_fleets(job, snapshot.fleets, memo)}


_ORDER_AFTER_PRIORITY = attrgetter("submitted_at", "run_id", "replica_num", "job_num", "id")
_PRIORITY = attrgetter("priority")
_GANG = attrgetter("run_id", "replica_num")


def queue_gangs(queue: Iterable[QueuedJob]) -> dict[tuple[str, int], list[QueuedJob]]:
    """The queue's gangs (a run's replica: its jobs together), in the order a pass takes them: priority
    (higher first), then submission time. (Two stable sorts on attribute keys: the order of
    ``(-priority, submitted_at, run_id, replica_num, job_num, id)``, ``queue_order.order_key``'s, compared in
    C rather than keyed in Python.)"""
    order = sorted(queue, key=_ORDER_AFTER_PRIORITY)
    order.sort(key=_PRIORITY, reverse=True)
    keys = list(map(_GANG, order))
    if len(set(keys)) == len(keys):  # a gang of one job each (a sweep's queue)
        return dict(zip(keys, map(_one, order), strict=True))
    gangs: dict[tuple[str, int], list[QueuedJob]] = {}
    for key, job in zip(keys, order, strict=True):
        gangs.setdefault(key, []).append(job)
    return gangs


def _one(job: QueuedJob) -> list[QueuedJob]:
    return [job]


def schedule(snapshot: Snapshot, now: float, *, reuse: bool = True) -> Plan:
    """The plan for ``snapshot`` at ``now``. ``reuse=False`` works every gang out afresh instead of reusing
    what earlier gangs of the same kind found (see :mod:`corral.scheduler.pass_memo`): the same plan, slower;
    the tests compare the two."""
    return _schedule(snapshot, now, queue_gangs(snapshot.queue), reuse, None)


def schedule_skipping(snapshot: Snapshot, now: float, skip: SettledSkip) -> Plan:
    """``schedule(snapshot, now)`` over the queue in ``skip``'s kept order that leaves out each settled gang
    (told to wait by an earlier pass) that ``schedule`` would tell to wait again, at most in new words
    (``_waits_again``; in fair-share order whole stretches of a project's queue, ``settled_skip``). Leaving
    it out changes nothing for the gangs after it, with the caller's guarantees (``head_pass``): no holds, and
    no job that may not wait or is past its retry deadline (a kind is taken for one without room only when its
    gang freed no idle instance of a shared host: what one could free only shrinks within a pass, as
    ``fleet_upkeep.reclaim_for`` reads the ledger); a gang past the starvation guard is left out only where it
    would hold no fleet not held already (``holds_nothing_new``). Its fair-share record is one its kind
    already made at a share no higher (a project's share only rises within a pass). The plan is ``schedule``'s
    less the skipped gangs' waits."""
    return _schedule(snapshot, now, skip.gangs() if not snapshot.shares else {}, True, skip)


def _waits_again(
    jobs: list[QueuedJob],
    memo: PassMemo,
    ledger: Ledger,
    held: set[str],
    book: QuotaBook | None,
    snapshot: Snapshot,
    now: float,
) -> bool:
    """Whether a gang of this gang's kind waited earlier in the pass where this one would wait too, and the same
    way: it found no room (capacity only goes down within a pass, so none is found later) and this gang would
    hold no fleet that is not held already (``holds_nothing_new``), or its project's ``quota.max`` refused the
    placement it found on the same capacity (the ledger's and the held fleets' versions) with the project
    holding the same (its quota version). Only the second holds for the same capacity alone: once another
    project takes an instance, the gang's best placement may be one beside its project's own jobs, which adds
    no instance to its holding. A wait for the quota holds nothing."""
    kind = memo.gang_kind(jobs)
    if kind is None:
        return False
    if memo.found_no_room(kind):
        return holds_nothing_new(jobs, kind, memo, held, book, snapshot, now)
    if book is None:
        return False
    verdict = memo.quota_refused.get((kind, ledger.version, len(held), book.version(jobs[0].project_id)))
    return isinstance(verdict, QuotaVerdict) and not verdict.never


def holds_nothing_new(
    jobs: list[QueuedJob],
    kind: Hashable,
    memo: PassMemo,
    held: set[str],
    book: QuotaBook | None,
    snapshot: Snapshot,
    now: float,
) -> bool:
    """Whether this gang, of a kind that found no room in the pass, would add no fleet to those ``held`` for
    earlier jobs where ``schedule_gang`` told it to wait: it has not waited past the starvation guard, its
    project is at its ``quota.max`` for this kind (it waits for the quota; the holding only grows within a
    pass), or every fleet its kind could ever run in is held already. False where the pass cannot tell yet."""
    head = jobs[0]
    if snapshot.hold_after is None or now - head.submitted_at < snapshot.hold_after:
        return True
    capped = known_at_max(jobs, kind, book, memo) if book is not None else False
    if capped is None:
        return False  # not asked at this holding yet
    if capped:
        return True
    reach = memo.reach(kind)
    return reach is not None and reach <= held


def _schedule(  # noqa: C901
    snapshot: Snapshot,
    now: float,
    gangs: dict[tuple[str, int], list[QueuedJob]],
    reuse: bool,
    skip: SettledSkip | None,
) -> Plan:
    ledger = initial_ledger(snapshot)
    out: list[Gang] = []
    held: set[str] = set()
    book = QuotaBook(snapshot) if snapshot.quotas else None
    shares = ShareBook(snapshot) if snapshot.shares else None
    holding = active_holds(snapshot, now)
    if holding:  # the runs capacity is held for go first, each with what is held for it given back
        reserved = Reserved(ledger.free_blocks, holding)
        for run_id in [r for r in dict.fromkeys(k[0] for k in gangs) if r in holding]:
            ledger.changed(reserved.give_back(run_id))
            placed = False
            for key in [k for k in gangs if k[0] == run_id]:
                jobs = gangs.pop(key)
                decisions = schedule_gang(jobs, snapshot, ledger, now, held, PassMemo(), book)
                placed = placed or any(isinstance(d, (Assign, Reserve)) for d in decisions)
                if decisions:
                    out.append(Gang(run_id, tuple(decisions), jobs[0].project_id))
                    if shares is not None:
                        shares.take(jobs[0].project_id, decisions)
            if not placed:  # still waiting: the hold stands for the rest of the pass
                ledger.changed(reserved.take(run_id, by_instance(holding[run_id])))
    memo = PassMemo()
    queues: dict[str, KindQueues] | None = None
    if shares is not None and skip is not None:
        queues = skip.queues()
        ordered = fair_order_of(queues, shares)
    else:
        ordered = fair_order(list(gangs.items()), shares) if shares is not None else iter(gangs.items())
    earlier: dict[str, tuple[str, float, set[str]]] = {}
    repeat = RepeatWait() if reuse else None
    notes_version = 0  # moves each time a gang's record changes ``earlier``
    for (run_id, _replica), jobs in ordered:
        if skip is not None and skip.settled(jobs) and _waits_again(jobs, memo, ledger, held, book, snapshot, now):
            if queues is not None:
                skip.after_skipping(((run_id, _replica), jobs), queues, memo)
            continue
        note = FairNote(jobs[0], shares, earlier, _fleet_ids(jobs[0], snapshot, memo)) if shares is not None else None
        context = (shares.generation if shares is not None else 0, notes_version)
        decisions = schedule_gang(
            jobs, snapshot, ledger, now, held, memo if reuse else PassMemo(), book, note, repeat, context
        )
        # (a repeated wait's record would change nothing: its kind recorded the same project, share and fleets)
        if note is not None and not (repeat is not None and repeat.hit) and note.record():
            notes_version += 1
        if decisions:
            out.append(Gang(run_id, tuple(decisions), jobs[0].project_id))
            if shares is not None:
                shares.take(jobs[0].project_id, decisions)
    return Plan(tuple(out))
