"""The pure scheduler: capacity is never over-committed within a plan, and queue semantics hold."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.domain.resources import Gpu, InstanceResources, Range, Requirements
from corral.scheduler.fleet_upkeep import upkeep
from corral.scheduler.schedule import NO_FLEETS_MESSAGE, SPECIFIED_FLEETS_MESSAGE, schedule
from corral.scheduler.types import (
    Assign,
    Fail,
    FleetSlot,
    InstanceSlot,
    Offer,
    QueuedJob,
    Reserve,
    Snapshot,
    Wait,
    WaitPolicy,
)

MACHINE = InstanceResources(cpus=8, memory_mib=32768, gpus=(), disk_size_mib=500_000, cpu_arch="x86")
GPU_MACHINE = InstanceResources(
    cpus=16, memory_mib=65536, gpus=(Gpu("H200", 141_000),) * 2, disk_size_mib=500_000, cpu_arch="x86"
)
SMALL = Requirements(cpu_count=Range(1, None), memory=Range(1.0, None), disk=Range(1.0, None))
OFFER = Offer("local", "local", "local", 0.0, MACHINE)


def job(
    i: int,
    priority: int = 0,
    req: Requirements = SMALL,
    may_wait: bool = True,
    run: str | None = None,
    fleets: tuple[str, ...] | None = None,
    policy: str = "reuse-or-create",
    nodes: int = 1,
    num: int = 0,
) -> QueuedJob:
    return QueuedJob(
        id=f"j{i}-{num}",
        run_id=run or f"r{i}",
        project_id="p",
        run_name=f"run-{i}",
        job_num=num,
        priority=priority,
        submitted_at=float(i),
        requirements=req,
        fleet_names=fleets,
        creation_policy=policy,
        wait=WaitPolicy(may_wait),
        nodes=nodes,
        multinode=nodes > 1,
    )


def inst(
    i: int,
    fleet: str = "f",
    status: str = "idle",
    busy: int = 0,
    total: int = 1,
    res: InstanceResources = MACHINE,
) -> InstanceSlot:
    return InstanceSlot(
        id=f"i{i}",
        fleet_id=fleet,
        name=f"{fleet}-{i}",
        instance_num=i,
        status=status,
        resources=res,
        total_blocks=total,
        busy_blocks=busy,
    )


def fleet(
    instances: tuple[InstanceSlot, ...] = (),
    nodes_max: int | None = 3,
    name: str = "f",
    fid: str = "f",
    offers: tuple[Offer, ...] = (OFFER,),
    blocks: int | None = 1,
    nodes_min: int = 0,
    placement: str = "any",
) -> FleetSlot:
    return FleetSlot(
        id=fid,
        project_id="p",
        name=name,
        nodes_min=nodes_min,
        nodes_max=nodes_max,
        blocks=blocks,
        placement=placement,
        offers=offers,
        instances=instances,
    )


def decisions(snapshot: Snapshot) -> list[object]:
    return [d for g in schedule(snapshot, now=100.0).gangs for d in g.decisions]


def test_seed_scenario_ten_jobs_three_nodes() -> None:
    ds = decisions(Snapshot(fleets=(fleet(),), queue=tuple(job(i) for i in range(10))))
    reserves = [d for d in ds if isinstance(d, Reserve)]
    waits = [d for d in ds if isinstance(d, Wait)]
    assert len(reserves) == 3
    assert len(waits) == 7
    assert all("at most 3 instances" in w.message for w in waits)


def test_idle_instance_is_reused_before_new_capacity() -> None:
    ds = decisions(Snapshot(fleets=(fleet((inst(0),)),), queue=(job(1),)))
    assert ds == [Assign("j1-0", "i0", 1)]


def test_no_fleet_and_unknown_fleet_messages() -> None:
    assert decisions(Snapshot(fleets=(), queue=(job(1),))) == [Fail("j1-0", NO_FLEETS_MESSAGE)]
    ds = decisions(Snapshot(fleets=(fleet(),), queue=(job(1, fleets=("other",)),)))
    assert ds == [Fail("j1-0", f"{SPECIFIED_FLEETS_MESSAGE}: no fleet named 'other' (its fleets: f)")]


def test_job_that_can_never_fit_fails_at_once_naming_fleet() -> None:
    gpu_req = Requirements(
        cpu_count=Range(1, None),
        memory=Range(1.0, None),
        disk=Range(1.0, None),
        gpu=SMALL.gpu.__class__(count=Range(1, None)) if SMALL.gpu else None,
    )
    (d,) = decisions(Snapshot(fleets=(fleet(),), queue=(job(1, req=gpu_req),)))
    assert isinstance(d, Fail)
    assert "fleet 'f'" in d.message


def test_retry_false_fails_instead_of_waiting() -> None:
    full = fleet((inst(0, status="busy", busy=1),), nodes_max=1)
    (d,) = decisions(Snapshot(fleets=(full,), queue=(job(1, may_wait=False),)))
    assert d == Fail("j1-0", "Fleet is at capacity: fleet 'f' has 1 of at most 1 instances, none free")


def test_capacity_being_freed_is_waited_for_even_without_a_no_capacity_retry() -> None:
    """An instance being terminated (a lost host given up, an idle one retired) frees its place soon: a job
    whose ``retry`` does not cover no-capacity waits for it instead of failing (its run's retry after a lost
    host would otherwise fail at once on a fleet of one)."""
    ending = fleet((inst(0, status="terminating"),), nodes_max=1)
    (d,) = decisions(Snapshot(fleets=(ending,), queue=(job(1, may_wait=False),)))
    assert d == Wait("j1-0", "Waiting for capacity: instance f-0 of fleet 'f' is being terminated")
    two = fleet((inst(0, status="terminating"), inst(1, status="terminating")), nodes_max=2)
    (d,) = decisions(Snapshot(fleets=(two,), queue=(job(1, may_wait=False),)))
    assert isinstance(d, Wait) and d.message.endswith("is being terminated (and 1 more)")


def test_higher_priority_takes_capacity_first_and_lower_backfills_elsewhere() -> None:
    one_slot = fleet((inst(0),), nodes_max=1)
    ds = decisions(Snapshot(fleets=(one_slot,), queue=(job(1, priority=0), job(2, priority=50))))
    assert Assign("j2-0", "i0", 1) in ds
    assert any(isinstance(d, Wait) and d.job_id == "j1-0" for d in ds)


def test_blocks_pack_jobs_onto_one_instance() -> None:
    f = fleet((inst(0, total=4, res=MACHINE),), nodes_max=1, blocks=4)
    ds = decisions(Snapshot(fleets=(f,), queue=tuple(job(i) for i in range(6))))
    assigns = [d for d in ds if isinstance(d, Assign)]
    assert len(assigns) == 4 and all(a.instance_id == "i0" for a in assigns)


def test_reuse_policy_never_reserves() -> None:
    ds = decisions(Snapshot(fleets=(fleet(),), queue=(job(1, policy="reuse", may_wait=False),)))
    assert ds and all(isinstance(d, Fail) for d in ds)


def test_multinode_gang_is_all_or_nothing() -> None:
    cluster = fleet(nodes_max=2, placement="cluster")
    gang = tuple(job(1, run="r1", nodes=3, num=n) for n in range(3))
    (d0, *_rest) = decisions(Snapshot(fleets=(cluster,), queue=gang))
    assert isinstance(d0, Fail)  # 3 nodes can never fit nodes.max 2
    cluster3 = fleet(nodes_max=3, placement="cluster")
    ds = decisions(Snapshot(fleets=(cluster3,), queue=gang))
    assert sum(isinstance(d, Reserve) for d in ds) == 3
    not_cluster = fleet(nodes_max=3)
    ds = decisions(Snapshot(fleets=(not_cluster,), queue=gang))
    assert all(isinstance(d, Fail) and "cluster" in d.message for d in ds)


def test_upkeep_fills_to_nodes_min() -> None:
    f = fleet((inst(0),), nodes_min=3)
    assert len(upkeep(f)) == 2


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    fleets = []
    for fi in range(draw(st.integers(1, 3))):
        nodes_max = draw(st.one_of(st.none(), st.integers(0, 4)))
        total = draw(st.sampled_from([1, 2, 4]))
        n_inst = draw(st.integers(0, nodes_max if nodes_max is not None else 3))
        insts = tuple(
            inst(
                fi * 10 + k,
                fleet=f"f{fi}",
                status=draw(st.sampled_from(["idle", "busy", "pending", "terminating"])),
                busy=draw(st.integers(0, total)),
                total=total,
            )
            for k in range(n_inst)
        )
        fleets.append(fleet(insts, nodes_max=nodes_max, name=f"f{fi}", fid=f"f{fi}", blocks=total))
    queue = tuple(
        job(i, priority=draw(st.integers(0, 3)), may_wait=draw(st.booleans())) for i in range(draw(st.integers(0, 12)))
    )
    return Snapshot(fleets=tuple(fleets), queue=queue)


@settings(max_examples=300, deadline=None)
@given(snapshots())
def test_plan_never_overcommits(snapshot: Snapshot) -> None:
    ds = decisions(snapshot)
    by_fleet = {f.id: f for f in snapshot.fleets}
    # Each job gets at most one decision.
    assert max(Counter(getattr(d, "job_id", None) for d in ds).values(), default=0) <= 1
    # nodes.max is never exceeded, counting every non-terminated instance.
    reserves = Counter(d.fleet_id for d in ds if isinstance(d, Reserve))
    for fid, n in reserves.items():
        f = by_fleet[fid]
        if f.nodes_max is not None:
            assert len(f.instances) + n <= f.nodes_max
    # Blocks of an instance are never over-committed.
    used: Counter[str] = Counter()
    for d in ds:
        if isinstance(d, Assign):
            used[d.instance_id] += d.blocks
    for f in snapshot.fleets:
        for i in f.instances:
            assert i.busy_blocks + used[i.id] <= max(i.total_blocks, i.busy_blocks)
            if used[i.id]:
                assert i.status in ("idle", "busy", "pending", "provisioning")


def test_large_job_at_head_holds_capacity_after_waiting() -> None:
    # A 2-node gang waits for a cluster fleet with one free instance; small jobs keep arriving.
    cluster = fleet((inst(0), inst(1, status="busy", busy=1)), nodes_max=2, placement="cluster")
    gang = tuple(job(1, run="big", nodes=2, num=n) for n in range(2))
    small = job(2)
    young = Snapshot(fleets=(cluster,), queue=(*gang, small), hold_after=60.0)
    ds = [d for g in schedule(young, now=10.0).gangs for d in g.decisions]
    assert Assign("j2-0", "i0", 1) in ds  # not waited long yet: backfill is allowed
    old = Snapshot(fleets=(cluster,), queue=(*gang, small), hold_after=60.0)
    ds = [d for g in schedule(old, now=100.0).gangs for d in g.decisions]
    assert not any(isinstance(d, Assign) for d in ds)  # the big job holds the fleet now
    waits = {d.job_id: d.message for d in ds if isinstance(d, Wait)}
    assert "holds the fleets" in waits["j2-0"]


@settings(max_examples=100, deadline=None)
@given(snapshots())
def test_same_input_same_plan(snapshot: Snapshot) -> None:
    assert schedule(snapshot, now=100.0) == schedule(snapshot, now=100.0)


def test_selectors_pin_to_existing_instances_only() -> None:
    from corral.domain.selectors import FleetRef, Selector

    f = fleet((inst(0), inst(1)), nodes_max=5)
    pinned = QueuedJob(**{**job(1).__dict__, "selectors": (Selector(name="f-1"),), "project_name": "p"})
    assert decisions(Snapshot(fleets=(f,), queue=(pinned,))) == [Assign("j1-0", "i1", 1)]
    by_fleet = QueuedJob(
        **{**job(2).__dict__, "project_name": "p", "selectors": (Selector(fleet=FleetRef("F"), instance_num=0),)}
    )
    assert decisions(Snapshot(fleets=(replace_project(f, "p"),), queue=(by_fleet,))) == [Assign("j2-0", "i0", 1)]
    busy = fleet((inst(0, status="busy", busy=1),), nodes_max=5)
    existing_only = QueuedJob(**{**job(3).__dict__, "selectors": ()})
    (d,) = decisions(Snapshot(fleets=(busy,), queue=(existing_only,)))
    assert isinstance(d, Wait)  # room for 4 more instances, but an `instances` run never gets a new one
    nothing = QueuedJob(**{**job(4).__dict__, "selectors": (Selector(hostname="nowhere"),)})
    (d,) = decisions(Snapshot(fleets=(f,), queue=(nothing,)))
    assert isinstance(d, Fail) and "hostname: nowhere" in d.message


def replace_project(f: FleetSlot, name: str) -> FleetSlot:
    from dataclasses import replace

    return replace(f, project_name=name)


@settings(max_examples=200, deadline=None)
@given(snapshots(), st.data())
def test_a_barred_backend_never_gets_the_job(snapshot: Snapshot, data: st.DataObject) -> None:
    # some of each fleet's instances and offers are of a backend "local" some jobs may not use
    def relabel(f: FleetSlot) -> FleetSlot:
        insts = tuple(replace(i, backend=data.draw(st.sampled_from(["local", "ssh"]))) for i in f.instances)
        offers = tuple(replace(o, backend=data.draw(st.sampled_from(["local", "remote"]))) for o in f.offers)
        return replace(f, instances=insts, offers=offers)

    fleets = tuple(relabel(f) for f in snapshot.fleets)
    queue = tuple(
        replace(q, barred_backends=frozenset({"local"})) if data.draw(st.booleans()) else q for q in snapshot.queue
    )
    barred = {q.id for q in queue if q.barred_backends}
    backend_of = {i.id: i.backend for f in fleets for i in f.instances}
    for d in decisions(Snapshot(fleets=fleets, queue=queue)):
        if isinstance(d, Assign) and d.job_id in barred:
            assert backend_of[d.instance_id] != "local"
        if isinstance(d, Reserve) and d.job_id in barred:
            assert d.offer.backend != "local"


def test_a_job_barred_from_the_only_backend_fails_saying_why() -> None:
    f = fleet((inst(0),), offers=(OFFER,))
    f = replace(f, instances=tuple(replace(i, backend="local") for i in f.instances))
    barred = replace(job(1), barred_backends=frozenset({"local"}), wait=WaitPolicy(False))
    (d,) = decisions(Snapshot(fleets=(f,), queue=(barred,)))
    assert isinstance(d, Fail) and "without a sandbox" in d.message, d
