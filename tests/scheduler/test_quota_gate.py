"""Hard quotas in the pure pass: over random fleets and queues of two projects (one exporting its fleets to
the other), no plan takes a project above its ``quota.max`` (GPUs counted per model of the instance or
offer a job lands on, CPUs, instances, price), reusing within the pass still gives the plan of working
each gang out afresh, a gang that would go above waits naming the quota (also where no fleet has room now,
when its project has no GPUs of the models it may get left under the max), and one that alone exceeds it
fails at once."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from test_pass_memo import busy_queues
from test_schedule import GPU_MACHINE, fleet, inst, job
from test_wait_reasons import ONE_GPU

from corral.domain.quotas import Usage, add, charge, limits_from_doc
from corral.domain.resources import Gpu, GpuSpec, Range
from corral.scheduler.schedule import schedule
from corral.scheduler.types import Assign, Fail, FairShare, Offer, Plan, ProjectQuota, Reserve, Snapshot, Wait


def _charged(plan: Plan, snapshot: Snapshot, held_on: dict[str, set[str]]) -> dict[str, Usage]:
    """What the plan takes per project, counted independently of the scheduler's own book."""
    instances = {i.id: i for f in snapshot.fleets for i in f.instances}
    project_of = {j.id: j.project_id for j in snapshot.queue}
    out: dict[str, Usage] = {}
    for gang in plan.gangs:
        for d in gang.decisions:
            if isinstance(d, Assign):
                i = instances[d.instance_id]
                assert i.resources is not None
                pid = project_of[d.job_id]
                held = charge([g.name for g in i.resources.gpus], i.resources.cpus, i.resources.memory_mib,
                              i.price, d.blocks, i.total_blocks)  # fmt: skip
                if i.id not in held_on.setdefault(pid, set()):
                    held_on[pid].add(i.id)
                    held["instances"] = 1.0
            elif isinstance(d, Reserve) and d.job_id is not None:
                pid = project_of[d.job_id]
                r = d.offer.resources
                held = charge([g.name for g in r.gpus], r.cpus, r.memory_mib, d.offer.price, d.blocks, d.total_blocks)
                held["instances"] = 1.0
            else:
                continue
            out[pid] = add(out.get(pid, {}), held)
    return out


LIMITS = st.fixed_dictionaries(
    {},
    optional={
        "gpu": st.one_of(st.integers(0, 4), st.fixed_dictionaries({"H200": st.integers(0, 3)})),
        "cpu": st.integers(0, 40),
        "instances": st.integers(0, 3),
        "price_per_hour": st.sampled_from([0.5, 2.0, 10.0]),
    },
)


@st.composite
def quota_snapshots(draw: st.DrawFn) -> Snapshot:
    base = draw(busy_queues())
    # half the queue belongs to a second project, which the fleets are exported to
    queue = tuple(replace(j, project_id="q", project_name="q") if draw(st.booleans()) else j for j in base.queue)
    runs_of_q = {j.run_id for j in queue if j.project_id == "q"}
    queue = tuple(replace(j, project_id="q", project_name="q") if j.run_id in runs_of_q else j for j in queue)
    fleets = tuple(replace(f, importer_project_ids=frozenset({"q"})) for f in base.fleets)
    quotas = {}
    for pid in ("p", "q"):
        if draw(st.booleans()):
            used = {"gpu": float(draw(st.integers(0, 2))), "cpu": float(draw(st.integers(0, 8)))}
            quotas[pid] = ProjectQuota(limits_from_doc(draw(LIMITS)), used, frozenset(), pid)
    return replace(base, fleets=fleets, queue=queue, quotas=quotas)


@settings(max_examples=60, deadline=None)
@given(quota_snapshots())
def test_no_plan_takes_a_project_above_its_quota_max(snapshot: Snapshot) -> None:
    plan = schedule(snapshot, 100.0)
    assert plan == schedule(snapshot, 100.0, reuse=False)
    taken = _charged(plan, snapshot, {})
    for pid, quota in snapshot.quotas.items():
        total = add(quota.used, taken.get(pid, {}))
        for dim, cap in quota.max.amounts.items():
            if taken.get(pid, {}).get(dim, 0.0) > 0:
                assert total.get(dim, 0.0) <= cap + 1e-9, (pid, dim, total, cap)


def _gpu_snapshot(max_gpu: int, jobs: int, gpus_per_job: int = 1) -> Snapshot:
    insts = tuple(inst(k, total=2, res=GPU_MACHINE) for k in range(4))
    req = replace(ONE_GPU, gpu=GpuSpec(count=Range(gpus_per_job, gpus_per_job)))
    queue = tuple(replace(job(i, req=req), project_name="x") for i in range(jobs))
    quota = ProjectQuota(limits_from_doc({"gpu": {"H200": max_gpu}}), {}, frozenset(), "x")
    return Snapshot(fleets=(fleet(insts, blocks=2, offers=()),), queue=queue, quotas={"p": quota})


def test_a_gang_above_the_quota_waits_naming_it_and_one_alone_above_fails() -> None:
    plan = schedule(_gpu_snapshot(max_gpu=3, jobs=5), 0.0)
    decisions = [d for g in plan.gangs for d in g.decisions]
    assert sum(isinstance(d, Assign) for d in decisions) == 3
    waits = [d for d in decisions if isinstance(d, Wait)]
    assert len(waits) == 2 and {w.message for w in waits} == {"Waiting for quota: gpu H200 3/3 in project x"}
    (fail,) = [d for g in schedule(_gpu_snapshot(max_gpu=1, jobs=1, gpus_per_job=2), 0.0).gangs for d in g.decisions]
    assert isinstance(fail, Fail)
    assert fail.message == (
        "The run exceeds the quota of the project on its own: it needs gpu H200 2 but quota.max allows 1 in project x"
    )


def _full_fleet(max_doc: dict[str, object], used: Usage, other: bool = False) -> Snapshot:
    """Every block busy (``other``: one more instance, of A100s, busy too), project x holding ``used``."""
    insts = [inst(k, total=2, busy=2, res=GPU_MACHINE) for k in range(2)]
    if other:
        insts.append(inst(2, total=2, busy=2, res=replace(GPU_MACHINE, gpus=(Gpu("A100", 81920),) * 2)))
    queue = tuple(replace(job(i, req=ONE_GPU), project_name="x") for i in range(2))
    quota = ProjectQuota(limits_from_doc(max_doc), used, frozenset(), "x")
    return Snapshot(fleets=(fleet(tuple(insts), blocks=2, offers=()),), queue=queue, quotas={"p": quota})


def test_a_gang_with_no_room_waits_for_the_quota_where_more_capacity_would_not_start_it() -> None:
    def messages(snap: Snapshot) -> set[str]:
        plan = schedule(snap, 0.0)
        assert plan == schedule(snap, 0.0, reuse=False)
        decisions = [d for g in plan.gangs for d in g.decisions]
        assert all(isinstance(d, Wait) for d in decisions) and len(decisions) == 2
        return {d.message for d in decisions if isinstance(d, Wait)}

    h200 = {"gpu:H200": 2.0, "gpu": 2.0}
    assert messages(_full_fleet({"gpu": {"H200": 2}}, h200)) == {"Waiting for quota: gpu H200 2/2 in project x"}
    assert messages(_full_fleet({"gpu": 2}, h200)) == {"Waiting for quota: gpu 2/2 in project x"}
    # one more GPU within the max, or a model the max leaves open: capacity is what it waits for
    for snap in (_full_fleet({"gpu": {"H200": 3}}, h200), _full_fleet({"gpu": {"H200": 2}}, h200, other=True)):
        (message,) = messages(snap)
        assert message.startswith("Waiting for capacity"), message
    mixed = _full_fleet({"gpu": {"H200": 2}}, h200, other=True)
    only_h200 = replace(ONE_GPU, gpu=GpuSpec(names=("H200",), count=Range(1, 1)))
    mixed = replace(mixed, queue=tuple(replace(j, requirements=only_h200) for j in mixed.queue))
    assert messages(mixed) == {"Waiting for quota: gpu H200 2/2 in project x"}  # it asks for H200s only


def test_without_quotas_the_plan_is_unchanged() -> None:
    snap = _gpu_snapshot(max_gpu=3, jobs=5)
    plan = schedule(replace(snap, quotas={}), 0.0)
    assert sum(isinstance(d, Assign) for g in plan.gangs for d in g.decisions) == 5


def test_a_request_alone_above_the_max_is_named() -> None:
    from corral.scheduler.quota_gate import request_exceeds

    h100 = replace(ONE_GPU, gpu=GpuSpec(names=("h100",), count=Range(4, 8)))
    assert (
        request_exceeds(h100, 1, limits_from_doc({"gpu": {"H100": 2}})) == "gpu 4 of H100 but quota.max allows H100 2"
    )
    assert request_exceeds(h100, 1, limits_from_doc({"gpu": {"A100": 2}})) is None  # another model: not limited
    assert request_exceeds(h100, 2, limits_from_doc({"gpu": 6})) == "gpu 8 but quota.max allows 6"
    assert request_exceeds(h100, 2, limits_from_doc({"instances": 1})) == "instances 2 but quota.max allows 1"
    assert request_exceeds(h100, 1, limits_from_doc({})) is None


def test_a_gang_is_charged_for_what_it_takes_and_not_for_a_fleets_own_reservation() -> None:
    from corral.scheduler.quota_gate import QuotaBook, check

    setting_up = replace(inst(1), resources=None)
    snap = Snapshot(
        (fleet((inst(0, res=GPU_MACHINE, total=2), setting_up)),),
        (),
        quotas={"p": ProjectQuota(limits_from_doc({"gpu": 1}), project_name="main")},
    )
    book = QuotaBook(snap)
    upkeep_only = [Reserve("f", Offer("aws", "p5", "x", 9.0, GPU_MACHINE), 2, 2)]
    unknown = [Assign("j1", "gone", 1), Assign("j2", "i1", 1)]  # no longer there, resources not known yet
    assert check("p", [*upkeep_only, *unknown], book) is None
    assert book.used["p"].get("gpu", 0.0) == 0.0 and book.used["p"]["instances"] == 1.0
    assert check("p", [Assign("j3", "i0", 1)], book) is None  # one of the two GPUs
    verdict = check("p", [Assign("j4", "i0", 1)], book)
    assert verdict is not None and verdict.message == "Waiting for quota: gpu 1/1 in project main"
    alone = check("p", [Reserve("f", Offer("aws", "p5", "x", 9.0, GPU_MACHINE), 2, 2, job_id="j5")], QuotaBook(snap))
    assert alone is not None and alone.never
    assert (
        alone.message
        == "The run exceeds the quota of the project on its own: it needs gpu 2 but quota.max allows 1 in project main"
    )


def test_a_gang_of_no_known_kind_is_checked_against_the_max_every_time() -> None:
    from corral.scheduler.pass_memo import PassMemo
    from corral.scheduler.quota_gate import QuotaBook, at_max

    two = replace(ONE_GPU, gpu=GpuSpec(count=Range(2, 2)))
    snap = Snapshot((fleet(),), (), quotas={"p": ProjectQuota(limits_from_doc({"gpu": 1}), used={"gpu": 0.0})})
    memo = PassMemo()
    verdict = at_max([job(1, req=two)], None, snap.fleets, QuotaBook(snap), memo)
    assert verdict is not None and verdict.message == "Waiting for quota: gpu 0/1" and not verdict.never
    assert memo.quota_refused == {}
    assert at_max([job(1, req=ONE_GPU)], None, snap.fleets, QuotaBook(snap), memo) is None


def test_a_run_without_gpus_or_without_gpu_names_is_refused_only_by_the_totals() -> None:
    from corral.scheduler.quota_gate import request_exceeds

    cpu_only = replace(ONE_GPU, gpu=None)
    assert request_exceeds(cpu_only, 4, limits_from_doc({"gpu": 0, "cpu": 100})) is None
    assert request_exceeds(ONE_GPU, 1, limits_from_doc({"gpu": {"H100": 0}, "cpu": 100})) is None


def test_a_run_pinned_to_an_instance_waits_for_its_quota_like_any_other() -> None:
    from corral.domain.selectors import Selector

    pinned = replace(job(1, req=ONE_GPU), selectors=(Selector(name="f-0"),))
    quota = ProjectQuota(limits_from_doc({"gpu": 1}), used={"gpu": 1.0})
    snap = Snapshot((fleet((inst(0, res=GPU_MACHINE, total=2),)),), (pinned,), quotas={"p": quota})
    assert [d for g in schedule(snap, 0.0).gangs for d in g.decisions] == [Wait("j1-0", "Waiting for quota: gpu 1/1")]
    free = replace(snap, quotas={"p": replace(quota, used={})})
    assert [d for g in schedule(free, 0.0).gangs for d in g.decisions] == [Assign("j1-0", "i0", 1)]


def test_a_project_without_a_max_is_never_held_back_by_the_quota_gate() -> None:
    from corral.scheduler.pass_memo import PassMemo
    from corral.scheduler.quota_gate import QuotaBook, at_max, check

    two = replace(ONE_GPU, gpu=GpuSpec(count=Range(2, 2)))
    snap = Snapshot((fleet(),), (), quotas={"other": ProjectQuota(limits_from_doc({"gpu": 0}))})
    book = QuotaBook(snap)
    assert check("p", [Assign("j", "i0", 1)], book) is None
    assert at_max([job(1, req=two)], "kind", snap.fleets, book, PassMemo()) is None
    empty = replace(snap, quotas={"p": ProjectQuota(limits_from_doc({}))})
    assert check("p", [Assign("j", "i0", 1)], QuotaBook(empty)) is None


def test_a_gang_asking_no_gpus_is_never_at_the_gpu_max() -> None:
    from corral.scheduler.pass_memo import PassMemo
    from corral.scheduler.quota_gate import QuotaBook, at_max

    snap = Snapshot((fleet(),), (), quotas={"p": ProjectQuota(limits_from_doc({"gpu": 0}))})
    assert at_max([job(1)], None, snap.fleets, QuotaBook(snap), PassMemo()) is None  # gpu count 0..
    cpu_only = replace(ONE_GPU, gpu=None)
    assert at_max([job(1, req=cpu_only)], None, snap.fleets, QuotaBook(snap), PassMemo()) is None


def test_a_placement_over_the_max_on_its_own_names_the_dimension_it_needs() -> None:
    from corral.scheduler.quota_gate import QuotaBook, check

    quota = ProjectQuota(limits_from_doc({"cpu": 100, "gpu": 1}))
    snap = Snapshot((fleet((inst(0, res=GPU_MACHINE),)),), (), quotas={"p": quota})
    verdict = check("p", [Assign("j", "i0", 1)], QuotaBook(snap))
    assert verdict is not None and verdict.never
    assert (
        verdict.message == "The run exceeds the quota of the project on its own: it needs gpu 2 but quota.max allows 1"
    )


def test_a_held_run_over_its_quota_waits_for_the_quota_and_keeps_its_hold() -> None:
    from test_preemption import cluster, running, waiting

    from corral.scheduler.types import Hold

    snap = cluster(1, [running(0, 0, priority=60)])
    quota = ProjectQuota(limits_from_doc({"gpu": 1}), used={"gpu": 1.0})
    snap = replace(snap, queue=tuple(waiting(9, 90)), holds=(Hold("i0", "r9", 1, 1060.0),), quotas={"p": quota})
    decisions = [d for g in schedule(snap, 1000.0).gangs for d in g.decisions]
    assert decisions == [Wait("j9-0", "Waiting for quota: gpu 1/1")]


def test_gangs_of_one_kind_refused_by_the_quota_are_told_the_same_wait() -> None:
    quota = ProjectQuota(limits_from_doc({"gpu": 1}), used={"gpu": 1.0})
    idle = tuple(inst(n, res=GPU_MACHINE, total=2) for n in range(2))
    snap = Snapshot((fleet(idle),), (job(1, req=ONE_GPU), job(2, req=ONE_GPU)), quotas={"p": quota})
    told = [Wait("j1-0", "Waiting for quota: gpu 1/1"), Wait("j2-0", "Waiting for quota: gpu 1/1")]
    assert [d for g in schedule(snap, 0.0).gangs for d in g.decisions] == told
    # with fair share on as well (the first gang's turn is recorded between the two)
    shared = replace(snap, shares={"p": FairShare()})
    assert [d for g in schedule(shared, 0.0).gangs for d in g.decisions] == told
