"""Preemption's pure decision on small clusters of two-GPU hosts (one GPU a block): a higher-priority run
takes the place of the fewest, most recently started preemptible gangs of its project; a project below its
nominal quota reclaims from a borrowing one; never a gang younger than ``min_runtime``, never part of a gang,
never a service unless its project names services, at most ``max_victims_per_cycle`` gangs; a run that
waits as it did still preempts; what a stopping victim frees or a hold keeps is its preemptor's alone; a
snapshot older than a job's end is seen stale; and, driven by a Hypothesis state machine, no two runs ever
preempt each other back and forth."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from test_schedule import GPU_MACHINE, fleet, inst, job
from test_wait_reasons import ONE_GPU

from corral.domain.quotas import QuotaPolicy, charge, limits_from_doc
from corral.scheduler.preemption import RECLAIM, WITHIN_PROJECT, RunningJob, Settings, choose
from corral.scheduler.preemption_room import freed_since
from corral.scheduler.schedule import schedule
from corral.scheduler.types import Assign, Hold, QueuedJob, Snapshot

ON = Settings(enabled=True, min_priority_gap=10, min_runtime=0.0, max_victims_per_cycle=8)
GPU = charge(["H200"], 8, 32768, 0.0, 1, 2)  # one block (one GPU) of GPU_MACHINE
OPEN = {"p": QuotaPolicy(preemptible_max_priority=50), "q": QuotaPolicy(preemptible_max_priority=50)}


def running(
    n: int, host: int, priority: int = 0, started: float = 0.0, project: str = "p", run: str | None = None, **kw: object
) -> RunningJob:
    r = run or f"v{n}"
    base = RunningJob(f"{r}-{n}", r, r, project, priority, started, "task", f"i{host}", 1, GPU)
    return replace(base, **kw)  # type: ignore[arg-type]


def cluster(hosts: int, jobs: list[RunningJob], projects: tuple[str, ...] = ("p", "q")) -> Snapshot:
    busy = {h: sum(1 for j in jobs if j.instance_id == f"i{h}") for h in range(hosts)}
    insts = tuple(
        inst(h, total=2, busy=busy[h], status="busy" if busy[h] else "idle", res=GPU_MACHINE) for h in range(hosts)
    )
    f = replace(fleet(insts, blocks=2, offers=()), importer_project_ids=frozenset(projects))
    return Snapshot(fleets=(f,), queue=())


def waiting(n: int, priority: int, gpus: int = 1, project: str = "p", at: float = 100.0) -> list[QueuedJob]:
    assert ONE_GPU.gpu is not None
    req = replace(ONE_GPU, gpu=replace(ONE_GPU.gpu, count=replace(ONE_GPU.gpu.count, min=gpus, max=gpus)))
    return [replace(job(n, priority=priority, req=req), project_id=project, project_name=project, submitted_at=at)]


def decide(
    snap: Snapshot,
    queue: list[QueuedJob],
    run: list[RunningJob],
    policies: dict[str, QuotaPolicy] = OPEN,
    s: Settings = ON,
    now: float = 1000.0,
) -> list[tuple[str, str, str]]:
    snap = replace(snap, queue=tuple(queue))
    plan = schedule(snap, now)
    return [(p.run_id, p.preemptor_run_id, p.rule) for p in choose(snap, plan, run, policies, s, now, schedule)]


def test_off_by_default_and_without_a_preemptible_policy() -> None:
    run = [running(i, i // 2, started=float(i)) for i in range(4)]
    snap = cluster(2, run)
    assert decide(snap, waiting(9, 90), run, s=Settings()) == []
    assert decide(snap, waiting(9, 90), run, policies={}) == []
    assert decide(snap, waiting(9, 90), run, policies={"p": QuotaPolicy(preemptible_max_priority=None)}) == []


def test_takes_the_most_recently_started_lowest_priority_gang_only() -> None:
    run = [
        running(0, 0, started=10.0),
        running(1, 0, started=30.0),
        running(2, 1, priority=5, started=50.0),
        running(3, 1, started=20.0),
    ]
    assert decide(cluster(2, run), waiting(9, 90), run) == [("v1", "r9", WITHIN_PROJECT)]


def test_priority_gap_and_max_priority() -> None:
    run = [running(i, i // 2, priority=40, started=float(i)) for i in range(4)]
    snap = cluster(2, run)
    assert decide(snap, waiting(9, 49), run) == []  # 9 above: under the gap of 10
    assert decide(snap, waiting(9, 50), run) == [("v3", "r9", WITHIN_PROJECT)]
    tight = {"p": QuotaPolicy(preemptible_max_priority=39)}
    assert decide(snap, waiting(9, 90), run, policies=tight) == []
    # a gap of 0 still needs a strictly higher priority
    assert decide(snap, waiting(9, 40), run, s=replace(ON, min_priority_gap=0)) == []


def test_min_runtime_protects_young_gangs() -> None:
    run = [running(0, 0, started=100.0), running(1, 0, started=990.0)]
    s = replace(ON, min_runtime=600.0)
    assert decide(cluster(1, run), waiting(9, 90), run, s=s) == [("v0", "r9", WITHIN_PROJECT)]
    young = [running(0, 0, started=500.0), running(1, 0, started=990.0)]
    assert decide(cluster(1, young), waiting(9, 90), young, s=s) == []


def test_a_gang_is_preempted_whole_and_only_when_needed() -> None:
    # a two-node gang (one GPU on each host) and a single one-GPU job: a 1-GPU run takes the single job
    gang = [running(0, 0, run="g", started=500.0), running(1, 1, run="g", started=500.0)]
    single = running(2, 0, started=100.0)
    full = [*gang, single, running(3, 1, priority=60, started=0.0)]  # priority 60: not preemptible
    assert decide(cluster(2, full), waiting(9, 90), full) == [("g", "r9", WITHIN_PROJECT)]
    # a 2-GPU run on one host: the gang's node there and the single job must both go
    out = decide(cluster(2, full), waiting(9, 90, gpus=2), full)
    assert sorted(out) == [("g", "r9", WITHIN_PROJECT), ("v2", "r9", WITHIN_PROJECT)]


def test_services_are_not_preempted_unless_named() -> None:
    run = [running(i, 0, started=float(i), run_type="service") for i in range(2)]
    assert decide(cluster(1, run), waiting(9, 90), run) == []
    named = {"p": QuotaPolicy(preemptible_max_priority=50, preemptible_run_types=("task", "service"))}
    assert decide(cluster(1, run), waiting(9, 90), run, policies=named) == [("v1", "r9", WITHIN_PROJECT)]


def test_victims_bounded_per_cycle() -> None:
    run = [running(i, i // 2, started=float(i)) for i in range(8)]
    queue = [*waiting(9, 90, gpus=2, at=1.0), *waiting(10, 90, gpus=2, at=2.0), *waiting(11, 90, gpus=2, at=3.0)]
    out = decide(cluster(4, run), queue, run, s=replace(ON, max_victims_per_cycle=3))
    assert len(out) == 2  # the second run would need 2 more: it waits for the next cycle
    assert {p for _, p, _ in out} == {"r9"}


def test_stopping_gangs_are_counted_as_freed() -> None:
    run = [running(0, 0, stopping=True), running(1, 0, started=5.0)]
    assert decide(cluster(1, run), waiting(9, 90), run) == []


def test_a_run_that_waits_as_it_did_still_preempts() -> None:
    # its message unchanged, the plan has no decision for it: it still waits, and may still preempt
    run = [running(i, i // 2, started=float(i)) for i in range(4)]
    snap = replace(cluster(2, run), queue=tuple(waiting(9, 90)))
    (message,) = [d.message for g in schedule(snap, 1000.0).gangs for d in g.decisions]  # type: ignore[union-attr]
    again = [replace(j, status_message=message) for j in waiting(9, 90)]
    assert decide(cluster(2, run), again, run) == [("v3", "r9", WITHIN_PROJECT)]


STOPPED_FOR_R9 = "Preempted by run run-9 (a higher-priority run of its project)"


def test_what_a_stopping_victim_frees_is_its_preemptor_s_only() -> None:
    # v5 stops for r9: r10, before it in order, takes nothing of it and preempts for itself, once
    run = [running(i, i // 2, started=float(i)) for i in range(6)]
    run[5] = replace(run[5], stopping=True, preempted_for=STOPPED_FOR_R9)
    queue = [*waiting(9, 90, at=1.0), *waiting(10, 95, at=2.0)]
    assert decide(cluster(3, run), queue, run) == [("v4", "r10", WITHIN_PROJECT)]
    # stopped by a user instead: the first run to fit takes it, the next one preempts
    run[5] = replace(run[5], preempted_for=None)
    assert decide(cluster(3, run), queue, run) == [("v4", "r9", WITHIN_PROJECT)]


def test_what_is_held_for_a_preemptor_the_plan_leaves_waiting_is_its_own() -> None:
    # r9 (two GPUs of i0) preempted v0, which ended (its block held for r9), and v1, still stopping; r10
    # (one GPU, higher priority) counts neither free: it preempts v3, and r9 still gets the whole of i0
    run = [replace(running(1, 0, started=1.0), stopping=True, preempted_for=STOPPED_FOR_R9)]
    run += [running(2, 1, started=2.0), running(3, 1, started=3.0)]
    snap = replace(cluster(2, run), holds=(Hold("i0", "r9", 1, 2000.0),))
    queue = [*waiting(9, 90, gpus=2, at=1.0), *waiting(10, 95, at=2.0)]
    assert decide(snap, queue, run) == [("v3", "r10", WITHIN_PROJECT)]


def test_a_snapshot_older_than_a_job_s_end_is_seen_stale() -> None:
    snap = cluster(2, [running(0, 0), running(1, 1), running(2, 1)])
    assert not freed_since(snap, {"i0": 1, "i1": 2})
    assert not freed_since(snap, {"i0": 2, "i1": 2, "i9": 1})  # taken meanwhile, or a new instance: not freed
    assert freed_since(snap, {"i0": 1, "i1": 1})


def test_reclaim_from_a_borrowing_project() -> None:
    # q holds all 4 GPUs with a nominal of 1; p has a nominal of 2 and nothing: it takes 2 back, from q
    run = [running(i, i // 2, project="q", priority=90, started=float(i)) for i in range(4)]
    policies = {
        "p": QuotaPolicy(nominal=limits_from_doc({"gpu": 2})),
        "q": QuotaPolicy(nominal=limits_from_doc({"gpu": 1}), preemptible_max_priority=100),
    }
    out = decide(cluster(2, run), waiting(9, 0, gpus=2), run, policies=policies)
    assert out == [("v3", "r9", RECLAIM), ("v2", "r9", RECLAIM)]
    # a run that would take p above its nominal does not reclaim
    assert (
        decide(
            cluster(2, run),
            waiting(9, 0, gpus=2),
            run,
            policies={**policies, "p": QuotaPolicy(nominal=limits_from_doc({"gpu": 1}))},
        )
        == []
    )


# ---- no cycles -------------------------------------------------------------------------------------------

HOSTS = 2


class NoCycles(RuleBasedStateMachine):
    """Runs of two projects (one GPU each) submitted, scheduled, preempted and requeued on 2 two-GPU hosts;
    between two finishes (the only change that can make an earlier preemption's reverse legitimate), no
    pair of runs preempts each other both ways, min_runtime always holds and every victim gang is whole."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.n = 0
        self.waiting: list[QueuedJob] = []
        self.running: list[RunningJob] = []
        self.pairs: set[tuple[str, str]] = set()
        self.policies = {
            "p": QuotaPolicy(nominal=limits_from_doc({"gpu": 3}), preemptible_max_priority=60),
            "q": QuotaPolicy(nominal=limits_from_doc({"gpu": 1}), preemptible_max_priority=60),
        }
        self.s = replace(ON, min_runtime=5.0, max_victims_per_cycle=2)

    @rule(project=st.sampled_from(["p", "q"]), priority=st.sampled_from([0, 10, 20, 50, 90]))
    def submit(self, project: str, priority: int) -> None:
        self.n += 1
        self.waiting += waiting(self.n, priority, project=project, at=self.now)

    @rule(dt=st.sampled_from([1.0, 3.0, 10.0]))
    def tick(self, dt: float) -> None:
        self.now += dt

    @precondition(lambda self: self.running)
    @rule(k=st.integers(0, 50))
    def finish(self, k: int) -> None:
        self.running.pop(k % len(self.running))
        self.pairs.clear()

    @rule()
    def cycle(self) -> None:
        snap = replace(cluster(HOSTS, self.running), queue=tuple(self.waiting))
        plan = schedule(snap, self.now)
        out = choose(snap, plan, self.running, self.policies, self.s, self.now, schedule)
        by_run = {j.run_id: j for j in self.running}
        for p in out:
            victim = by_run[p.run_id]
            assert self.now - victim.started_at >= self.s.min_runtime
            assert set(p.job_ids) == {j.id for j in self.running if j.run_id == p.run_id}
            assert (p.run_id, p.preemptor_run_id) not in self.pairs, f"{p.run_id} preempts back {p.preemptor_run_id}"
            self.pairs.add((p.preemptor_run_id, p.run_id))
            self.running.remove(victim)
            self.n += 1
            # requeued: the same run, its place kept by its original submission
            back = waiting(0, victim.priority, project=victim.project_id, at=0.0)[0]
            self.waiting.append(
                replace(back, id=f"{victim.run_id}-{self.n}", run_id=victim.run_id, run_name=victim.run_name)
            )
        assert len(out) <= self.s.max_victims_per_cycle
        # what fits now is placed (the freed blocks included), as the next pass would
        again = replace(cluster(HOSTS, self.running), queue=tuple(self.waiting))
        for g in schedule(again, self.now).gangs:
            for d in g.decisions:
                if isinstance(d, Assign):
                    q = next(j for j in self.waiting if j.id == d.job_id)
                    self.waiting.remove(q)
                    host = int(d.instance_id[1:])
                    self.running.append(
                        RunningJob(
                            q.id, q.run_id, q.run_name, q.project_id, q.priority, self.now, "task", f"i{host}", 1, GPU
                        )
                    )

    @invariant()
    def never_overcommitted(self) -> None:
        for h in range(HOSTS):
            assert sum(1 for j in self.running if j.instance_id == f"i{h}") <= 2


class NoCyclesWithin(NoCycles):
    """The same without nominal quotas: only the within-project rule can preempt."""

    def __init__(self) -> None:
        super().__init__()
        self.policies = {p: QuotaPolicy(preemptible_max_priority=60) for p in ("p", "q")}


TestNoCycles = NoCycles.TestCase
TestNoCycles.settings = hsettings(max_examples=40, stateful_step_count=30, deadline=None)
TestNoCyclesWithin = NoCyclesWithin.TestCase
TestNoCyclesWithin.settings = hsettings(max_examples=40, stateful_step_count=30, deadline=None)


def test_victims_taken_on_the_way_but_not_needed_in_the_end_are_left_running() -> None:
    # host 0: v0 (the most recent) beside a job that may not be preempted; host 1: v1 and v2. A 2-GPU run
    # takes v0, then v1, then v2 before it fits (on host 1): v0 is then not needed and keeps running.
    run = [
        running(0, 0, started=50.0),
        running(3, 0, priority=60, started=0.0),
        running(1, 1, started=10.0),
        running(2, 1, started=5.0),
    ]
    out = decide(cluster(2, run), waiting(9, 90, gpus=2), run)
    assert sorted(out) == [("v1", "r9", WITHIN_PROJECT), ("v2", "r9", WITHIN_PROJECT)]


def test_a_run_with_something_unhashable_in_its_jobs_is_never_alike_another() -> None:
    from corral.scheduler.preemption import _likeness

    plain = waiting(1, 90)[0]
    assert _likeness((plain,)) == _likeness((replace(plain, id="other", run_id="r2"),))
    odd = replace(plain, fleet_names=["f"])  # type: ignore[arg-type]
    assert _likeness((odd,)) == odd.run_id


def test_a_project_within_its_nominal_quota_is_not_reclaimed_from() -> None:
    run = [running(i, i // 2, project="q", priority=90, started=float(i)) for i in range(4)]
    policies = {
        "p": QuotaPolicy(nominal=limits_from_doc({"gpu": 2})),
        "q": QuotaPolicy(nominal=limits_from_doc({"gpu": 4}), preemptible_max_priority=100),
    }
    assert decide(cluster(2, run), waiting(9, 0, gpus=2), run, policies=policies) == []


def test_nothing_is_preempted_when_no_run_waits() -> None:
    run = [running(0, 0), running(1, 0)]
    assert decide(cluster(2, run), [], run) == []


def test_reclaiming_never_counts_the_waiting_runs_own_project_among_the_borrowers() -> None:
    # p (nominal 2) holds one GPU with a run of the same priority as its waiting run: not a victim within p,
    # nor one to reclaim from; q borrows and gives one back
    run = [running(0, 0, project="p", priority=0, started=5.0), *(running(i, 1 if i < 3 else 0, project="q",
           priority=90, started=float(i)) for i in (1, 2, 3))]  # fmt: skip
    policies = {
        "p": QuotaPolicy(nominal=limits_from_doc({"gpu": 2}), preemptible_max_priority=100),
        "q": QuotaPolicy(nominal=limits_from_doc({"gpu": 0.5}), preemptible_max_priority=100),
    }
    out = decide(cluster(2, run), waiting(9, 0), run, policies=policies)
    assert [(v, rule) for v, _, rule in out] == [("v3", RECLAIM)]
