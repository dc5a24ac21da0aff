"""Preemption, the pure decision: which running gangs a waiting run may take the place of.

Two rules, as Kueue's ``withinClusterQueue: LowerPriority`` and ``reclaimWithinCohort``:

- **within a project** (``within_project``): a waiting run whose priority is at least ``min_priority_gap``
  above a running preemptible run of its own project (and always strictly above it) may take its place;
- **reclaim** (``reclaim``): a project below its nominal quota takes capacity back from projects holding
  more than theirs (borrowing), provided it stays at or below its nominal quota with what it takes.

A gang (every job of one run's replica: all the nodes of a multi-node task) is a victim whole. Only tasks
whose run priority is at most their project's ``preemptible_max_priority`` are preemptible (None: none of
the project's runs); services and dev environments only where the project names their run type
(``preemptible_run_types``). A gang younger than ``min_runtime`` or already stopping is never a victim.
Candidates are tried reclaimable ones first, then lowest priority, then most recently started; they are
taken greedily until the waiting run fits (the real ``schedule`` on the snapshot with the victims' blocks
freed), then every victim the run does not actually need is dropped, so victims are as few and as recent
as possible. At most ``max_victims_per_cycle`` gangs per call, and at most :data:`MAX_TRIES` waiting runs
tried (the rest are tried at the next pass).

Every run the plan does not place is a waiting run, whether or not its wait message changed. What a
stopping victim will free, and what a hold keeps (``scheduler.holds``), belongs to the preemptor it names:
that run is tried first, and no other run's trial counts those blocks free; a run that fits on freed
capacity takes it for the rest of the call (``scheduler.preemption_room``). Otherwise a run after it would
wait for capacity already promised, instead of preempting for itself.

No cycles (Kueue's argument): under ``within_project`` the preemptor's priority is strictly higher than its
victim's, so the victim can never take its place back by that rule; under ``reclaim`` the preemptor's
project is at or below its nominal quota afterwards and the victim's project was borrowing, so the victim's
project cannot reclaim from the preemptor's until one of them changes. Pure: ``now`` is a parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace

from corral.domain.quotas import QuotaPolicy, Usage, add, borrowed
from corral.scheduler.preemption_room import RunningJob as RunningJob
from corral.scheduler.preemption_room import (
    booked,
    charge_of,
    freed,
    held_for_others,
    held_for_preemptors,
    minus,
    waiting_gangs,
)
from corral.scheduler.types import Assign, Plan, QueuedJob, Snapshot

WITHIN_PROJECT = "within_project"
RECLAIM = "reclaim"
PREEMPTIBLE_TYPES = ("task",)
#: Waiting runs with candidates tried per call (each try places the run on trial snapshots).
MAX_TRIES = 16
#: Candidates a run's greedy pass may take before dropping the unneeded (a bound on the trials).
GREEDY_FACTOR = 4
#: The fields of a waiting job that decide whether victims can make room for it (``_likeness``): all but
#: its identity, submission time, message and waiting policy.
_ALIKE_FIELDS = tuple(
    f.name
    for f in fields(QueuedJob)
    if f.name not in ("id", "run_id", "run_name", "submitted_at", "status_message", "wait")
)


#: How a preempted submission's message starts (``runs/get`` and ``scheduler.holds`` read the preemptor from it).
PREEMPTED_PREFIX = "Preempted by run "


@dataclass(frozen=True)
class Settings:
    """``scheduling.preemption`` (durations in seconds)."""

    enabled: bool = False
    min_priority_gap: int = 10
    min_runtime: float = 600.0
    grace_period: float = 120.0
    max_victims_per_cycle: int = 8


@dataclass(frozen=True)
class Preemption:
    """Stop ``job_ids`` (one gang) so that ``preemptor_run_id`` can take their place."""

    run_id: str
    run_name: str
    job_ids: tuple[str, ...]
    preemptor_run_id: str
    preemptor_run_name: str
    rule: str
    #: The preemptor's project (named in the message when it is not the victim's: a reclaim).
    preemptor_project_name: str = ""

    @property
    def message(self) -> str:
        """What the victim's stop says; ``scheduler.holds`` reads the preemptor back from it."""
        if self.rule == WITHIN_PROJECT:
            return f"{PREEMPTED_PREFIX}{self.preemptor_run_name} (a higher-priority run of its project)"
        project = f" of project {self.preemptor_project_name}" if self.preemptor_project_name else ""
        return f"{PREEMPTED_PREFIX}{self.preemptor_run_name}{project} (a project reclaiming its quota)"


Place = Callable[[Snapshot, float], Plan]


@dataclass(frozen=True)
class _Victim:
    key: tuple[str, int]
    jobs: tuple[RunningJob, ...]
    _usage: Usage = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        out: Usage = {}
        for j in self.jobs:
            out = add(out, j.usage)
        object.__setattr__(self, "_usage", out)

    @property
    def project_id(self) -> str:
        return self.jobs[0].project_id

    @property
    def priority(self) -> int:
        return self.jobs[0].priority

    @property
    def started_at(self) -> float:
        return max(j.started_at for j in self.jobs)

    def usage(self) -> Usage:
        return self._usage


def preemptible(job: RunningJob, policy: QuotaPolicy | None) -> bool:
    """Whether the project's policy lets the job's run be preempted at all (its type and priority)."""
    if policy is None or policy.preemptible_max_priority is None:
        return False
    types = policy.preemptible_run_types or PREEMPTIBLE_TYPES
    return job.run_type in types and job.priority <= policy.preemptible_max_priority


def choose(  # noqa: C901, PLR0915
    snapshot: Snapshot,
    plan: Plan,
    running: Sequence[RunningJob],
    policies: Mapping[str, QuotaPolicy],
    settings: Settings,
    now: float,
    place: Place,
) -> tuple[Preemption, ...]:
    """The gangs to stop this cycle, for the waiting runs ``plan`` (this pass's plan of ``snapshot``) left
    waiting; ``place`` is ``schedule``. Empty when preemption is off."""
    if not settings.enabled or settings.max_victims_per_cycle <= 0:
        return ()
    waiting = waiting_gangs(snapshot, plan)
    if not waiting:
        return ()
    stopping = [j for j in running if j.stopping]
    held = held_for_preemptors(snapshot, plan, stopping, now)
    if held:  # what is held for a waiting run (or a stopping victim frees for it) goes to it first
        waiting.sort(key=lambda js: js[0].run_id not in held)
    work = booked(freed(snapshot, stopping), plan)
    usage: dict[str, Usage] = {}
    for j in running:
        if not j.stopping:
            usage[j.project_id] = add(usage.get(j.project_id, {}), j.usage)
    gangs: dict[tuple[str, int], list[RunningJob]] = {}
    for j in running:
        gangs.setdefault((j.run_id, j.replica_num), []).append(j)
    pool = [
        _Victim(k, tuple(js))
        for k, js in gangs.items()
        if not any(j.stopping for j in js)
        and all(preemptible(j, policies.get(j.project_id)) for j in js)
        and now - max(j.started_at for j in js) >= settings.min_runtime
    ]
    out: list[Preemption] = []
    budget = settings.max_victims_per_cycle
    tries = MAX_TRIES
    hopeless: set[object] = set()  # runs like one that found no victims this call: not tried again
    #: (project, priority) -> its candidates, until victims are chosen (they depend on nothing else)
    candidates: dict[tuple[str, int], tuple[list[_Victim], list[_Victim]]] = {}
    for jobs in waiting:
        if budget <= 0 or not pool or tries <= 0:
            break
        head = jobs[0]
        asks = (head.project_id, head.priority)
        if asks not in candidates:
            candidates[asks] = _candidates(head, pool, usage, policies, settings)
        within, reclaim = candidates[asks]
        if not within and not reclaim:
            continue  # nothing it may take: no placement tried
        like = _likeness(jobs)
        if like in hopeless:
            continue
        tries -= 1
        fit = _fits(work, jobs, (), now, place, held)
        if fit is not None:
            # it fits without taking anything (capacity a stopping gang frees): that capacity is its own in
            # this call, so that a run after it does not count it free too and wait instead of preempting
            usage[head.project_id] = add(usage.get(head.project_id, {}), charge_of(work, fit))
            work = booked(work, fit)
            held.pop(head.run_id, None)
            candidates.clear()
            continue
        found = _victims_for(work, jobs, within, reclaim, usage, policies, budget, now, place, held)
        if found is None:
            hopeless.add(like)
            continue
        victims, rule, placed = found
        for v in victims:
            pool.remove(v)
            usage[v.project_id] = minus(usage.get(v.project_id, {}), v.usage())
            out.append(
                Preemption(
                    v.key[0],
                    v.jobs[0].run_name,
                    tuple(j.id for j in v.jobs),
                    head.run_id,
                    head.run_name,
                    rule,
                    head.project_name,
                )
            )
        budget -= len(victims)
        candidates.clear()
        usage[head.project_id] = add(usage.get(head.project_id, {}), charge_of(work, placed))
        work = booked(freed(work, [j for v in victims for j in v.jobs]), placed)
        held.pop(head.run_id, None)
    return tuple(out)


def _likeness(jobs: tuple[QueuedJob, ...]) -> object:
    """What decides whether victims can make room for a run: a run alike finds none when this one did not."""
    try:
        return hash((len(jobs), tuple(tuple(getattr(j, f) for f in _ALIKE_FIELDS) for j in jobs)))
    except TypeError:  # something unhashable in a job: never alike
        return jobs[0].run_id


def _candidates(
    head: QueuedJob,
    pool: list[_Victim],
    usage: dict[str, Usage],
    policies: Mapping[str, QuotaPolicy],
    settings: Settings,
) -> tuple[list[_Victim], list[_Victim]]:
    """The gangs the waiting run may take the place of: of its project (priority gap), and of borrowing
    projects (only when its project has a nominal quota to reclaim)."""
    own = policies.get(head.project_id, QuotaPolicy())
    gap = max(1, settings.min_priority_gap)
    within = [v for v in pool if v.project_id == head.project_id and head.priority >= v.priority + gap]
    if own.nominal.is_empty():
        return within, []
    above: dict[str, Usage] = {}  # per project: what it holds above its nominal quota
    reclaim = []
    for v in pool:
        if v.project_id == head.project_id:
            continue
        policy = policies.get(v.project_id, QuotaPolicy())
        if v.project_id not in above:
            above[v.project_id] = borrowed(usage.get(v.project_id, {}), policy.nominal)
        if _borrowing(above[v.project_id], v.usage(), policy):
            reclaim.append(v)
    return within, reclaim


def _victims_for(
    work: Snapshot,
    jobs: tuple[QueuedJob, ...],
    within: list[_Victim],
    reclaim: list[_Victim],
    usage: dict[str, Usage],
    policies: Mapping[str, QuotaPolicy],
    budget: int,
    now: float,
    place: Place,
    held: Mapping[str, Mapping[str, int]],
) -> tuple[list[_Victim], str, Plan] | None:
    head = jobs[0]
    own = policies.get(head.project_id, QuotaPolicy())
    # reclaimable first (their projects are above nominal), then lowest priority, then most recently started
    for candidates in (reclaim + within, within):
        ordered = sorted(candidates, key=lambda v: (v.project_id == head.project_id, v.priority, -v.started_at, v.key))
        found = _greedy(work, jobs, ordered, budget, now, place, held)
        if found is None:
            continue
        victims, placed = found
        if any(v.project_id != head.project_id for v in victims):
            after = add(usage.get(head.project_id, {}), charge_of(work, placed))
            if not _within_nominal(after, own):
                continue  # taking back would put the project above its nominal quota: not a reclaim
            return victims, RECLAIM, placed
        return victims, WITHIN_PROJECT, placed
    return None


def _greedy(
    work: Snapshot,
    jobs: tuple[QueuedJob, ...],
    ordered: list[_Victim],
    budget: int,
    now: float,
    place: Place,
    held: Mapping[str, Mapping[str, int]],
) -> tuple[list[_Victim], Plan] | None:
    """Victims taken in order until the run fits, then those it does not need dropped (Kueue's way)."""
    chosen: list[_Victim] = []
    placed: Plan | None = None
    for v in ordered[: GREEDY_FACTOR * budget]:
        chosen.append(v)
        placed = _fits(work, jobs, [j for c in chosen for j in c.jobs], now, place, held)
        if placed is not None:
            break
    if placed is None:
        return None
    for v in list(reversed(chosen[:-1])):
        rest = [c for c in chosen if c is not v]
        again = _fits(work, jobs, [j for c in rest for j in c.jobs], now, place, held)
        if again is not None:
            chosen, placed = rest, again
    if len(chosen) > budget:
        return None
    return chosen, placed


def _fits(
    work: Snapshot,
    jobs: tuple[QueuedJob, ...],
    gone: Sequence[RunningJob],
    now: float,
    place: Place,
    held: Mapping[str, Mapping[str, int]],
) -> Plan | None:
    """The run's placement on existing instances once ``gone`` are gone, None when it still does not fit.
    The blocks ``held`` for other waiting runs stay taken: the trial's queue is this run alone, so the
    snapshot's holds bind only its own."""
    trial = replace(held_for_others(freed(work, gone), held, jobs[0].run_id), queue=jobs, shares={}, hold_after=None)
    plan = place(trial, now)
    decisions = [d for g in plan.gangs for d in g.decisions]
    if len(decisions) == len(jobs) and all(isinstance(d, Assign) for d in decisions):
        return plan
    return None


def _borrowing(above: Mapping[str, float], holds: Mapping[str, float], policy: QuotaPolicy) -> bool:
    """Whether a project holding ``above`` its nominal quota (``borrowed``) is above it in a dimension the
    quota names and the gang holds. Only named dimensions count, as for the reclaiming project
    (``_within_nominal``): were an unnamed one (nominal 0) borrowing here but not there, two projects could
    take a run back and forth."""
    named = policy.nominal.amounts
    return any(above.get(d, 0.0) > 1e-9 for d, v in holds.items() if v > 0 and d in named and d != "price_per_hour")


def _within_nominal(used: Mapping[str, float], policy: QuotaPolicy) -> bool:
    """Whether ``used`` is at or below every dimension the nominal quota names."""
    return all(used.get(d, 0.0) <= cap + 1e-9 for d, cap in policy.nominal.amounts.items())
