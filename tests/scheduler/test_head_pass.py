"""A pass over the queue's head (``schedule_head``) gives ``schedule``'s plan less only the waits of gangs it
skipped: the same placements, reservations, reclaims and failures, and for every gang it did work out the
same decisions, with or without quotas and fair shares, and with jobs past the starvation guard; where it cannot
show that (holds, a skipped job that would fail now) it says so and the caller makes a whole pass."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from test_pass_memo import TWO_CPUS, busy_queues
from test_quota_gate import quota_snapshots
from test_schedule import GPU_MACHINE, MACHINE, SMALL, fleet, inst, job
from test_wait_reasons import ONE_GPU

from corral.domain.quotas import Limits
from corral.domain.resources import GpuSpec, Range, Requirements
from corral.domain.selectors import Selector
from corral.scheduler.blocks import carved_offers
from corral.scheduler.head_pass import no_room_left, schedule_head
from corral.scheduler.ledger import initial_ledger
from corral.scheduler.queue_order import QueueOrder
from corral.scheduler.schedule import queue_gangs, schedule
from corral.scheduler.types import (
    Assign,
    Decision,
    Fail,
    FairShare,
    Hold,
    Offer,
    Plan,
    ProjectQuota,
    QueuedJob,
    Reclaim,
    Reserve,
    Snapshot,
    Wait,
    WaitPolicy,
)

NOW = 100.0
#: Three blocks of a four-block host of ``MACHINE`` (8 CPUs): a gang that waits where smaller ones still fit.
BIG_BLOCKS = replace(SMALL, cpu_count=Range(5, None))
TWO_GPUS = replace(ONE_GPU, gpu=GpuSpec(count=Range(2, 2)))


def head_of(snapshot: Snapshot, settled: Collection[str]) -> Plan | None:
    """``schedule_head`` at ``NOW`` with every queued job but the ``settled`` ones pending: the same plan with
    the order it sorts itself and with one kept job by job (put in another order, some twice)."""
    pending = {j.id for j in snapshot.queue}.difference(settled)
    kept = QueueOrder(reversed(snapshot.queue))
    for j in snapshot.queue[::2]:
        kept.put(j)
    plan = schedule_head(snapshot, NOW, pending)
    assert schedule_head(snapshot, NOW, pending, kept) == plan
    return plan


def by_job(plan: Plan) -> dict[str, Decision]:
    return {d.job_id: d for g in plan.gangs for d in g.decisions if not isinstance(d, Reclaim) and d.job_id}


def not_waits(plan: Plan) -> list[Decision]:
    return [d for g in plan.gangs for d in g.decisions if not isinstance(d, Wait)]


@settings(max_examples=200, deadline=None)
@given(busy_queues(), st.data())
def test_the_head_pass_gives_the_whole_pass_plan_less_skipped_waits(snapshot: Snapshot, data: st.DataObject) -> None:
    _same_as_whole_less_skipped_waits(snapshot, data)


def _same_as_whole_less_skipped_waits(snapshot: Snapshot, data: st.DataObject) -> None:
    """With quotas or fair shares any queued job may be settled, also one this pass places: a pass over the
    head skips only gangs of a kind it found no room for in this very pass, whatever an earlier pass said."""
    # the starvation guard: none, every job past it, none past it, or the oldest jobs past it (at any priority)
    guard = data.draw(st.sampled_from([snapshot.hold_after, None, 1000.0, 85.0, 95.0]))
    snapshot = replace(snapshot, hold_after=guard)
    if data.draw(st.booleans()):  # every job may wait, none past its deadline: a head pass is made
        patient = (
            replace(j, wait=WaitPolicy(True, None if (j.wait.deadline or NOW + 1) <= NOW else j.wait.deadline))
            for j in snapshot.queue
        )
        snapshot = replace(snapshot, queue=tuple(patient))
    whole = schedule(snapshot, NOW)
    decided = by_job(whole)
    # settled: jobs an earlier pass over these fleets told to wait (without policies, never one this pass places
    # or fails)
    waiting = sorted(
        j.id
        for j in snapshot.queue
        if snapshot.quotas or snapshot.shares or not isinstance(decided.get(j.id), (Assign, Reserve, Fail))
    )
    settled = set(data.draw(st.lists(st.sampled_from(waiting), unique=True)) if waiting else [])
    head = head_of(snapshot, settled)
    if head is None:
        assert any(
            not j.wait.may_wait or (j.wait.deadline is not None and j.wait.deadline <= NOW) for j in snapshot.queue
        )
        return
    assert not_waits(head) == not_waits(whole)
    head_decided = by_job(head)
    for job_id, decision in head_decided.items():
        assert decided.get(job_id) == decision
    for job_id in decided.keys() - head_decided.keys():
        assert job_id in settled and isinstance(decided[job_id], Wait)
    assert head_of(snapshot, set()) == whole  # nothing settled: the whole pass


@st.composite
def guarded_backlogs(draw: st.DrawFn) -> Snapshot:
    """Backlogs of two projects behind fleets with little or no room left, the oldest jobs (at any priority) past
    the starvation guard: a gang too big for what is left waits and holds the fleets it could use, so a smaller
    one behind it may not take what is left, and a new job behind it is told the fleets are held."""
    fleets = []
    for fi in range(draw(st.integers(1, 3))):
        name, total, res = f"f{fi}", draw(st.sampled_from([2, 4])), draw(st.sampled_from([MACHINE, GPU_MACHINE]))
        busy = [draw(st.integers(max(0, total - 2), total)) for _ in range(draw(st.integers(1, 3)))]
        insts = tuple(inst(fi * 10 + k, fleet=name, status="busy" if b else "idle", busy=b, total=total, res=res)
                      for k, b in enumerate(busy))  # fmt: skip
        grows = draw(st.integers(0, 4)) == 0  # now and then a fleet that may still take an instance
        slot = fleet(insts, nodes_max=len(insts) + grows, name=name, fid=name, blocks=total,
                     offers=(Offer("ssh", "ssh", "remote", 1.0, res),) if grows else ())  # fmt: skip
        fleets.append(replace(slot, importer_project_ids=frozenset({"q"})))
    queue: list[QueuedJob] = []
    for i in range(draw(st.integers(1, 24))):
        req = draw(st.sampled_from([SMALL, SMALL, TWO_CPUS, BIG_BLOCKS, ONE_GPU, TWO_GPUS]))
        pid = draw(st.sampled_from(["p", "q"]))
        at = float(draw(st.integers(0, 99))) + i / 1000
        for n in range(draw(st.sampled_from([1, 1, 1, 2]))):
            j = job(i, priority=draw(st.integers(0, 2)) if n == 0 else queue[-1].priority, req=req, num=n)
            queue.append(replace(j, project_id=pid, project_name=pid, submitted_at=at))
    shares, quotas = {}, {}
    if draw(st.booleans()):
        shares = {pid: FairShare(weight=draw(st.sampled_from([1.0, 2.0]))) for pid in ("p", "q")}
    for pid in ("p", "q"):  # a cap on CPUs, or on GPUs some of it held already (a gang above it waits for it)
        if draw(st.booleans()):
            dim = draw(st.sampled_from(["cpu", "gpu"]))
            used = {dim: float(draw(st.integers(0, 2)))}
            quotas[pid] = ProjectQuota(Limits({dim: float(draw(st.integers(1, 4)))}), used, frozenset(), pid)
    return Snapshot(
        fleets=tuple(fleets),
        queue=tuple(queue),
        hold_after=draw(st.sampled_from([None, 10.0, 40.0, 70.0])),
        shares=shares,
        quotas=quotas,
    )


@settings(max_examples=400, deadline=None)
@given(guarded_backlogs(), st.data())
def test_a_backlog_past_the_starvation_guard_keeps_its_head_passes(snapshot: Snapshot, data: st.DataObject) -> None:
    """Every job may wait and none has a deadline: whatever has waited past the guard, the head pass is made, and
    it is the whole pass less the waits of gangs it skipped."""
    whole = schedule(snapshot, NOW)
    waiting = sorted(j.id for j in snapshot.queue)
    settled = set(data.draw(st.lists(st.sampled_from(waiting), unique=True)))
    if not (snapshot.quotas or snapshot.shares):  # without policies an earlier pass placed none of the settled
        settled -= {job_id for job_id, d in by_job(whole).items() if not isinstance(d, Wait)}
    head = head_of(snapshot, settled)
    assert head is not None
    assert not_waits(head) == not_waits(whole)
    decided, head_decided = by_job(whole), by_job(head)
    for job_id, decision in head_decided.items():
        assert decided.get(job_id) == decision
    for job_id in decided.keys() - head_decided.keys():
        assert job_id in settled and isinstance(decided[job_id], Wait)


def test_under_fair_shares_an_old_gang_of_a_kind_cut_short_still_holds_its_fleets() -> None:
    """In fair-share order a kind that found no room is read on only at its pending gangs, and at its first gang
    past the starvation guard: an old gang of lower priority, behind a settled one of the kind that has not waited
    long, holds the fleet, so a small job behind it may not take the block that is left."""
    host = fleet((inst(0, status="busy", busy=3, total=4),), nodes_max=1, offers=(), blocks=4)

    def queued(i: int, req: Requirements, priority: int, at: float) -> QueuedJob:
        return replace(job(i, priority=priority, req=req), submitted_at=at)

    queue = (queued(0, BIG_BLOCKS, 2, 90.0), queued(1, BIG_BLOCKS, 2, 91.0), queued(2, BIG_BLOCKS, 0, 10.0),
             queued(3, SMALL, 0, 20.0))  # fmt: skip
    snapshot = Snapshot(fleets=(host,), queue=queue, hold_after=50.0, shares={"p": FairShare()})
    whole = by_job(schedule(snapshot, NOW))
    held = whole["j3-0"]
    assert isinstance(held, Wait) and "holds the fleets" in held.message
    head = head_of(snapshot, {j.id for j in queue})
    assert head is not None
    assert by_job(head) == {job_id: whole[job_id] for job_id in ("j0-0", "j2-0", "j3-0")}


def _gpu_host_queue(busy: int, quota: ProjectQuota, queue: list[tuple[Requirements, int, float]]) -> Snapshot:
    """One two-GPU host of two blocks (``busy`` of them held) and the queue of (requirements, priority, submitted
    at) of project p, capped by ``quota``, the oldest past a starvation guard of 50 s."""
    host = fleet((inst(0, status="busy", busy=busy, total=2, res=GPU_MACHINE),), nodes_max=1, offers=(), blocks=2)
    jobs = tuple(replace(job(i, priority=p, req=req), submitted_at=at) for i, (req, p, at) in enumerate(queue))
    return Snapshot(fleets=(host,), queue=jobs, hold_after=50.0, quotas={"p": quota})


def test_an_old_gang_waiting_for_its_quota_holds_nothing_and_is_left_out() -> None:
    """A project at its ``quota.max`` of GPUs with no room anyway: its gangs wait for the quota, which holds no
    fleet, so an old one past the guard behind the first is left out like any other."""
    snapshot = _gpu_host_queue(
        2, ProjectQuota(Limits({"gpu": 1.0}), {"gpu": 1.0}), [(ONE_GPU, 0, t) for t in (10, 11, 12)]
    )
    whole = by_job(schedule(snapshot, NOW))
    assert all(isinstance(d, Wait) and "quota" in d.message for d in whole.values())
    head = head_of(snapshot, {j.id for j in snapshot.queue})
    assert head is not None and by_job(head) == {"j0-0": whole["j0-0"]}


def test_an_old_gang_is_worked_out_again_once_its_project_took_more_in_the_pass() -> None:
    """Whether a gang waits for its quota (holding nothing) or for room (holding its fleets) was asked at what its
    project held then: once the project took a GPU in the pass, an old gang of that kind is worked out again."""
    queue = [(TWO_GPUS, 2, 90.0), (ONE_GPU, 1, 91.0), (TWO_GPUS, 0, 10.0)]
    snapshot = _gpu_host_queue(1, ProjectQuota(Limits({"gpu": 4.0}), {"gpu": 0.0}), queue)
    whole = by_job(schedule(snapshot, NOW))
    assert isinstance(whole["j1-0"], Assign)
    head = head_of(snapshot, {j.id for j in snapshot.queue})
    assert head is not None and by_job(head) == whole


@st.composite
def policy_snapshots(draw: st.DrawFn) -> Snapshot:
    """Two projects sharing the fleets, with quotas or fair shares or both, with or without a shared host."""
    snapshot = draw(quota_snapshots())
    shares = {}
    if draw(st.booleans()):
        for pid in ("p", "q"):
            nominal = Limits({"cpu": float(draw(st.sampled_from([0, 2, 8])))})
            used = {"cpu": float(draw(st.integers(0, 8))), "instances": float(draw(st.integers(0, 2)))}
            shares[pid] = FairShare(weight=draw(st.sampled_from([1.0, 2.0, 3.0])), nominal=nominal, used=used)
    pools = snapshot.host_pools if draw(st.booleans()) else {}
    return replace(snapshot, shares=shares, host_pools=pools)


@settings(max_examples=300, deadline=None)
@given(policy_snapshots(), st.data())
def test_under_quotas_and_fair_shares_too(snapshot: Snapshot, data: st.DataObject) -> None:
    _same_as_whole_less_skipped_waits(snapshot, data)


def test_a_settled_gang_of_a_kind_without_room_is_skipped_under_fair_shares() -> None:
    """A full fleet shared by two projects: the settled jobs of the kind that found no room get no decision, the
    new one the whole pass's wait, fair-share note and all."""
    busy = tuple(inst(i, status="busy", busy=1) for i in range(2))
    full = replace(fleet(busy, nodes_max=2), importer_project_ids=frozenset({"q"}))
    queue = [replace(job(i), project_id="q", project_name="q") if i % 2 else job(i) for i in range(6)]
    shares = {"p": FairShare(weight=1.0), "q": FairShare(weight=1.0, used={"cpu": 4.0}, nominal=Limits({"cpu": 1.0}))}
    snapshot = Snapshot(fleets=(full,), queue=tuple(queue), shares=shares)
    whole = by_job(schedule(snapshot, NOW))
    assert all(isinstance(d, Wait) for d in whole.values()) and len(whole) == 6
    head = head_of(snapshot, {j.id for j in queue[:5]})
    assert head is not None
    # the first settled gang of each project's kind is worked out (only then does the pass know it finds no room),
    # the other settled ones are skipped, and the new one gets the whole pass's wait
    assert by_job(head) == {k: whole[k] for k in ("j0-0", "j1-0", "j5-0")}
    note = whole["j5-0"]
    assert isinstance(note, Wait) and "fair share: project 'p'" in note.message
    assert head_of(snapshot, set()) == schedule(snapshot, NOW)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(0, 2), st.integers(0, 1), st.integers(0, 3)),
        max_size=30,
    )
)
def test_queue_gangs_orders_and_groups_as_the_queue_order_says(
    specs: list[tuple[int, int, int, int, int]],
) -> None:
    """Two stable sorts on attribute keys give ``(-priority, submitted_at, run_id, replica_num, job_num, id)``'s
    order; jobs of one run's replica form one gang, in the order of its first job."""
    queue = [
        replace(job(t, priority=p, run=f"r{run}", num=num), replica_num=replica, id=f"{run}-{replica}-{num}-{k}")
        for k, (p, t, run, replica, num) in enumerate(specs)
    ]
    expected: dict[tuple[str, int], list[QueuedJob]] = {}
    for j in sorted(queue, key=lambda j: (-j.priority, j.submitted_at, j.run_id, j.replica_num, j.job_num, j.id)):
        expected.setdefault((j.run_id, j.replica_num), []).append(j)
    got = queue_gangs(queue)
    assert list(got.items()) == list(expected.items())


def drain_snapshot(queued: int, busy: int) -> Snapshot:
    """Four one-block instances at their fleet's ``nodes.max`` (``busy`` of them running a job) and a sweep."""
    instances = tuple(inst(i, status="busy" if i < busy else "idle", busy=1 if i < busy else 0) for i in range(4))
    return Snapshot(fleets=(fleet(instances, nodes_max=4),), queue=tuple(job(i) for i in range(queued)))


def test_a_drain_places_the_next_job_and_skips_the_settled_rest() -> None:
    snapshot = drain_snapshot(1000, busy=3)
    settled = {j.id for j in snapshot.queue[1:]}
    head = head_of(snapshot, settled)
    assert head is not None
    assert [d for g in head.gangs for d in g.decisions] == [Assign("j0-0", "i3", 1)]
    assert not_waits(schedule(snapshot, NOW)) == not_waits(head)


def test_jobs_not_yet_settled_are_worked_out_and_told_to_wait() -> None:
    snapshot = drain_snapshot(10, busy=3)
    head = head_of(snapshot, {f"j{i}-0" for i in range(1, 8)})
    assert head is not None
    decided = by_job(head)
    assert decided["j0-0"] == Assign("j0-0", "i3", 1)
    assert set(decided) == {"j0-0", "j8-0", "j9-0"} and isinstance(decided["j9-0"], Wait)
    assert decided["j9-0"] == by_job(schedule(snapshot, NOW))["j9-0"]


def test_capacity_left_means_nothing_is_skipped() -> None:
    snapshot = replace(drain_snapshot(3, busy=0), fleets=(fleet((inst(0),), nodes_max=None),))
    assert not no_room_left(snapshot, initial_ledger(snapshot))
    assert head_of(snapshot, {"j1-0", "j2-0"}) == schedule(snapshot, NOW)


def test_a_settled_job_past_its_retry_deadline_needs_a_whole_pass() -> None:
    snapshot = drain_snapshot(5, busy=4)
    late = replace(snapshot.queue[3], wait=WaitPolicy(True, deadline=NOW - 1))
    snapshot = replace(snapshot, queue=(*snapshot.queue[:3], late, snapshot.queue[4]))
    assert head_of(snapshot, {j.id for j in snapshot.queue}) is None
    assert isinstance(by_job(schedule(snapshot, NOW))[late.id], Fail)


def test_past_the_starvation_guard_the_first_settled_gang_holds_the_fleets_and_the_rest_are_skipped() -> None:
    """A backlog past the starvation guard (most of a long queue) keeps its passes over the head: the first
    settled gang past the guard is worked out, which holds the fleet for it, and a new job behind the settled
    ones is told what the whole pass tells it (the fleet is held)."""
    snapshot = replace(drain_snapshot(6, busy=4), hold_after=50.0)
    assert all(NOW - j.submitted_at >= 50.0 for j in snapshot.queue)
    whole = by_job(schedule(snapshot, NOW))
    head = head_of(snapshot, {j.id for j in snapshot.queue[:5]})
    assert head is not None
    assert by_job(head) == {"j0-0": whole["j0-0"], "j5-0": whole["j5-0"]}
    held = whole["j5-0"]
    assert isinstance(held, Wait) and "an earlier job that has waited long holds the fleets" in held.message
    assert head_of(replace(snapshot, hold_after=500.0), {j.id for j in snapshot.queue}) == Plan(())


def test_holds_need_a_whole_pass() -> None:
    snap = Snapshot((fleet(),), (job(1),))
    assert head_of(snap, set()) is not None
    quotas = {"p": ProjectQuota(Limits({"gpu": 1.0}))}
    assert head_of(replace(snap, quotas=quotas), set()) == schedule(replace(snap, quotas=quotas), NOW)
    assert head_of(replace(snap, shares={"p": FairShare()}), set()) == schedule(
        replace(snap, shares={"p": FairShare()}), NOW
    )
    shared = replace(snap, host_pools={"local": (0, 4)}, shares={"p": FairShare()})
    assert head_of(shared, set()) == schedule(shared, NOW)
    assert head_of(replace(snap, holds=(Hold("i0", "r1", 1, NOW + 60),)), set()) is None


def test_a_gang_already_told_the_same_wait_gets_no_decision() -> None:
    full = Snapshot((fleet((inst(0, status="busy", busy=1),), nodes_max=1),), (job(1),))
    ((wait,),) = [g.decisions for g in schedule(full, NOW).gangs]
    assert isinstance(wait, Wait)
    told = replace(full, queue=(replace(job(1), status_message=wait.message),))
    assert head_of(told, set()) == Plan(())


def test_a_queued_job_that_may_not_wait_needs_a_whole_pass() -> None:
    snap = Snapshot((fleet((inst(0, status="busy", busy=1),), nodes_max=1),), (job(1),))
    assert head_of(snap, set()) is not None
    impatient = replace(job(1), wait=WaitPolicy(False))
    assert head_of(replace(snap, queue=(impatient,)), set()) is None


def test_a_gang_its_quota_kept_off_one_instance_is_worked_out_again() -> None:
    """Only finding no room is for good within a pass: a gang the quota refused an idle instance (a new one for
    its project) fits, once another project took that instance, beside its project's own job. The pass over
    the head works the settled gang out, as the whole pass does, and places it."""
    idle, own = inst(0), replace(inst(1, status="busy", busy=1, total=2), price=1.0)
    shared = replace(fleet((idle, own), nodes_max=2, offers=()), importer_project_ids=frozenset({"q"}))
    first, other, later = job(0, priority=2), replace(job(1, priority=1), project_id="q", project_name="q"), job(2)
    quota = ProjectQuota(Limits({"instances": 1.0}), {"instances": 1.0}, frozenset({own.id}), "p")
    snapshot = Snapshot(fleets=(shared,), queue=(first, other, later), quotas={"p": quota})
    whole = by_job(schedule(snapshot, NOW))
    refused = whole[first.id]
    assert isinstance(refused, Wait) and "quota" in refused.message
    assert whole[other.id] == Assign(other.id, idle.id, 1)
    assert whole[later.id] == Assign(later.id, own.id, 1)
    head = head_of(snapshot, {first.id, later.id})
    assert head is not None and by_job(head) == whole


def test_a_project_queue_is_cut_short_only_once_every_kind_in_it_found_no_room() -> None:
    """Under fair shares a project's settled gangs are left out in one stretch only when no kind of gang it has
    queued fits: a later settled gang of another kind that fits is still placed."""
    full = fleet((inst(0, fleet="x", status="busy", busy=1),), nodes_max=1, name="x", fid="x", offers=())
    free = fleet((inst(1, fleet="y"),), nodes_max=1, name="y", fid="y", offers=())
    queue = (job(0, fleets=("x",)), job(1, fleets=("x",)), job(2, fleets=("y",)), job(3, fleets=("x",)))
    snapshot = Snapshot(fleets=(full, free), queue=queue, shares={"p": FairShare()})
    whole = by_job(schedule(snapshot, NOW))
    assert whole["j2-0"] == Assign("j2-0", "i1", 1)
    head = head_of(snapshot, {j.id for j in queue})
    assert head is not None
    assert by_job(head) == {"j0-0": whole["j0-0"], "j2-0": whole["j2-0"]}


def test_a_pending_gang_read_ahead_when_its_kind_is_cut_short_is_worked_out_once() -> None:
    full = fleet((inst(0, status="busy", busy=1),), nodes_max=1, offers=())
    queue = (job(0), job(1), job(2), job(3))
    snapshot = Snapshot(fleets=(full,), queue=queue, shares={"p": FairShare()})
    head = head_of(snapshot, {"j0-0", "j1-0", "j3-0"})
    assert head is not None
    assert [getattr(d, "job_id", None) for g in head.gangs for d in g.decisions] == ["j0-0", "j2-0"]


def test_a_gang_that_freed_idle_instances_of_the_shared_host_is_no_kind_without_room() -> None:
    """Two gangs of one kind each need a new instance of the local machine, whose blocks idle instances hold: the
    whole pass frees one for each. The first is not taken for a kind that found no room, so the second, settled,
    is worked out and frees the other."""
    carved = carved_offers("local", MACHINE, 4)
    idle = tuple(
        replace(inst(n, fleet="g", total=1), backend="local", host_blocks=2, offer=carved[1]) for n in range(2)
    )
    holder = fleet(idle, name="g", fid="g", offers=())
    grows = fleet((), nodes_max=None, offers=(carved[1],))
    queue = (job(1, fleets=("f",)), job(2, fleets=("f",)))
    snapshot = Snapshot((grows, holder), queue, host_pools={"local": (4, 4)}, shares={"p": FairShare()})
    whole = schedule(snapshot, NOW)
    assert [d for g in whole.gangs for d in g.decisions if isinstance(d, Reclaim)] == [
        Reclaim("i0", "Terminated to free this machine for run run-1"),
        Reclaim("i1", "Terminated to free this machine for run run-2"),
    ]
    assert head_of(snapshot, {j.id for j in queue}) == whole


def _two_fleets_and_a_quota(shares: bool) -> Snapshot:
    """Fleet ``x`` full; fleet ``z`` with one block free beside the project's own job; fleet ``y`` with an idle
    host the project's quota (two instances, both held) keeps it off; and a run pinned to an instance."""
    x = fleet((inst(0, fleet="x", status="busy", busy=1),), nodes_max=1, name="x", fid="x", offers=())
    held = inst(1, fleet="z", status="busy", busy=1, total=2)
    z = fleet((held,), nodes_max=1, name="z", fid="z", offers=())
    own = replace(inst(3, fleet="y", status="busy", busy=1, total=2), price=1.0)
    y = fleet((inst(2, fleet="y"), own), nodes_max=2, name="y", fid="y", offers=())
    pinned = replace(job(9), selectors=(Selector(name="x-0"),), project_name="p")
    queue = (
        *(job(i, fleets=("x",)) for i in range(2)),
        *(job(i, fleets=("z",)) for i in range(2, 5)),
        *(job(i, fleets=("y",)) for i in range(5, 8)),
        pinned,
    )
    quota = ProjectQuota(Limits({"instances": 2.0}), {"instances": 2.0}, frozenset({own.id, held.id}), "p")
    return Snapshot(fleets=(x, z, y), queue=queue, quotas={"p": quota}, shares={"p": FairShare()} if shares else {})


def test_every_way_a_settled_gang_is_left_out_or_worked_out() -> None:
    """Kinds without room are left out (and with fair share read no further), those the quota refused on the
    same capacity left out one by one, and a gang pinned to instances always worked out: the plan is the whole
    pass's, with and without fair share."""
    for shares in (True, False):
        snapshot = _two_fleets_and_a_quota(shares)
        whole = by_job(schedule(snapshot, NOW))
        assert whole["j2-0"] == Assign("j2-0", "i1", 1)
        assert all(isinstance(whole[f"j{i}-0"], Wait) for i in (0, 1, 3, 4, 5, 6, 7, 9))
        told = replace(
            snapshot,
            queue=tuple(
                replace(j, status_message=d.message) if isinstance(d := whole[j.id], Wait) else j
                for j in snapshot.queue
            ),
        )
        head = head_of(told, {j.id for j in told.queue})
        assert head is not None
        assert not_waits(head) == not_waits(schedule(told, NOW))
        assert by_job(head) == {"j2-0": whole["j2-0"]}
