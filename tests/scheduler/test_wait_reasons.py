"""What the pure scheduler says while a job waits (the real constraint: busy instances, ``nodes.max``, the
backend's instance cap, the host's free blocks), the local host carved into instances, and the verdict
``runs/get_plan`` shows before ``apply`` (``refusal``) agreeing with what ``schedule`` does."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from test_schedule import MACHINE, SMALL, fleet, inst, job, snapshots

from corral.domain.resources import Gpu, GpuSpec, InstanceResources, Range
from corral.domain.selectors import Selector
from corral.scheduler.blocks import carved_offers
from corral.scheduler.schedule import refusal, schedule
from corral.scheduler.types import (
    Assign,
    Fail,
    FleetSlot,
    InstanceSlot,
    Offer,
    QueuedJob,
    Reclaim,
    Reserve,
    Snapshot,
    Wait,
)

HOST = InstanceResources(cpus=2, memory_mib=8192, gpus=(), disk_size_mib=100_000, cpu_arch="x86")
GPU_HOST = InstanceResources(cpus=4, memory_mib=16384, gpus=(Gpu("T4", 16384),), disk_size_mib=100_000)
ONE_GPU = replace(SMALL, gpu=GpuSpec(count=Range(1, 1)))


def local_fleet(host: InstanceResources, blocks: int, name: str = "f", **kw: object) -> FleetSlot:
    slot = fleet(offers=carved_offers("local", host, blocks), name=name, fid=name, **kw)  # type: ignore[arg-type]
    return replace(slot, backend_limit_key="local")


def waits(snapshot: Snapshot) -> dict[str, str]:
    return {d.job_id: d.message for g in schedule(snapshot, 100.0).gangs for d in g.decisions if isinstance(d, Wait)}


def test_the_backend_cap_is_named_not_the_fleet() -> None:
    # A 2-node run on an empty cluster fleet (0 of at most 2) blocked by the local backend's instance cap.
    cluster = local_fleet(HOST, 2, name="cluster-fleet", nodes_max=2, placement="cluster")
    gang = tuple(job(1, run="big", nodes=2, num=n) for n in range(2))
    snap = Snapshot(fleets=(cluster,), queue=gang, backend_limits={"local": (2, 2)}, host_pools={"local": (0, 2)})
    message = waits(snap)["j1-0"]
    assert "the local backend has reached its limit of 2 instances" in message
    assert "0 of at most 2" not in message and "needs 2 nodes at once" in message


def test_busy_instances_at_nodes_max_and_busy_selected_instances() -> None:
    full = fleet((inst(0, status="busy", busy=1),), nodes_max=1)
    assert waits(Snapshot(fleets=(full,), queue=(job(1),)))["j1-0"] == (
        "Waiting for capacity: fleet 'f' has 1 of at most 1 instances, none free"
    )
    pinned = replace(job(2), selectors=(Selector(name="f-0"),), project_name="p")
    assert "the instances `instances` selects are busy" in waits(Snapshot(fleets=(full,), queue=(pinned,)))["j2-0"]


def test_the_host_is_carved_and_a_second_gpu_job_waits_for_the_only_gpu() -> None:
    gpu_fleet = local_fleet(GPU_HOST, 1, nodes_max=None)
    snap = Snapshot(fleets=(gpu_fleet,), queue=(job(1, req=ONE_GPU), job(2, req=ONE_GPU)), host_pools={"local": (0, 1)})
    ds = [d for g in schedule(snap, 100.0).gangs for d in g.decisions]
    (reserve,) = [d for d in ds if isinstance(d, Reserve)]
    assert reserve.job_id == "j1-0" and reserve.offer.host_blocks == 1 and len(reserve.offer.resources.gpus) == 1
    assert waits(snap)["j2-0"] == (
        "Waiting for capacity: fleet 'f': this machine has 0 of its 1 blocks free "
        "and a local instance for the job needs 1"
    )


def test_a_small_job_takes_the_smallest_share_that_fits() -> None:
    snap = Snapshot(fleets=(local_fleet(HOST, 2, nodes_max=None),), queue=(job(1),), host_pools={"local": (1, 2)})
    (reserve,) = [d for g in schedule(snap, 100.0).gangs for d in g.decisions]
    assert isinstance(reserve, Reserve) and reserve.offer.host_blocks == 1 and reserve.offer.resources.cpus == 1
    two_cpus = replace(SMALL, cpu_count=Range(2, None))
    snap = replace(snap, queue=(job(2, req=two_cpus),))
    assert "this machine has 1 of its 2 blocks free" in waits(snap)["j2-0"]
    # more than the whole machine: it can never run, and says so at once
    many = replace(SMALL, cpu_count=Range(3, None))
    (fail,) = [d for g in schedule(replace(snap, queue=(job(3, req=many),)), 100.0).gangs for d in g.decisions]
    assert isinstance(fail, Fail) and "No fleet can ever run this job" in fail.message and "cpu" in fail.message


@st.composite
def pooled(draw: st.DrawFn) -> Snapshot:
    total = draw(st.integers(1, 4))
    used = draw(st.integers(0, total))
    host = draw(st.sampled_from([HOST, GPU_HOST]))
    fleets = tuple(
        local_fleet(host, total, name=f"f{i}", nodes_max=draw(st.one_of(st.none(), st.integers(0, 3))))
        for i in range(draw(st.integers(1, 2)))
    )
    reqs = st.sampled_from([SMALL, ONE_GPU, replace(SMALL, cpu_count=Range(2, None))])
    queue = tuple(job(i, req=draw(reqs)) for i in range(draw(st.integers(0, 6))))
    return Snapshot(fleets=fleets, queue=queue, host_pools={"local": (used, total)})


@settings(max_examples=200, deadline=None)
@given(pooled())
def test_the_host_pool_is_never_overcommitted(snapshot: Snapshot) -> None:
    used, total = snapshot.host_pools["local"]
    reserved = sum(
        d.offer.host_blocks for g in schedule(snapshot, 100.0).gangs for d in g.decisions if isinstance(d, Reserve)
    )
    assert used + reserved <= max(total, used)


@settings(max_examples=200, deadline=None)
@given(st.one_of(snapshots(), pooled()), st.sampled_from([None, ("f0",), ("nope",)]))
def test_the_plan_verdict_is_what_schedule_does(snapshot: Snapshot, fleet_names: tuple[str, ...] | None) -> None:
    """``refusal`` names exactly the failures that happen whatever the capacity (a job that may wait)."""
    for queued in snapshot.queue[:3]:
        probe: QueuedJob = replace(queued, fleet_names=fleet_names, wait=replace(queued.wait, may_wait=True))
        alone = replace(snapshot, queue=(probe,))
        decided = [d for g in schedule(alone, 100.0).gangs for d in g.decisions]
        failed = [d.message for d in decided if isinstance(d, Fail)]
        assert refusal(probe, alone) == (failed[0] if failed else None)


def _carved_inst(i: int, blocks: int, status: str = "idle", busy: int = 0) -> InstanceSlot:
    return replace(
        inst(i, status=status, busy=busy, res=carved_offers("local", HOST, 2)[blocks - 1].resources),
        backend="local",
        host_blocks=blocks,
    )


def test_idle_instances_holding_the_machine_are_reclaimed_for_a_bigger_job() -> None:
    two_cpus = replace(SMALL, cpu_count=Range(2, None))
    idle = local_fleet(HOST, 2, nodes_max=None)
    idle = replace(idle, instances=(_carved_inst(0, 1),))
    snap = Snapshot(fleets=(idle,), queue=(job(1, req=two_cpus),), host_pools={"local": (1, 2)})
    ds = [d for g in schedule(snap, 100.0).gangs for d in g.decisions]
    assert [type(d) for d in ds] == [Reclaim, Wait]
    assert ds[0] == Reclaim("i0", "Terminated to free this machine for run run-1")
    # a busy one is never reclaimed: the job just waits
    busy = replace(idle, instances=(_carved_inst(0, 1, status="busy", busy=1),))
    ds = [d for g in schedule(replace(snap, fleets=(busy,)), 100.0).gangs for d in g.decisions]
    assert [type(d) for d in ds] == [Wait]


@settings(max_examples=200, deadline=None)
@given(pooled(), st.lists(st.tuples(st.sampled_from(["idle", "busy"]), st.integers(1, 2)), max_size=3))
def test_only_idle_instances_are_reclaimed_and_nothing_is_placed_on_them(
    snapshot: Snapshot, carved: list[tuple[str, int]]
) -> None:
    insts = tuple(
        _carved_inst(10 + k, b, status=st_, busy=1 if st_ == "busy" else 0) for k, (st_, b) in enumerate(carved)
    )
    first = replace(snapshot.fleets[0], instances=insts)
    used = sum(b for _, b in carved)
    snap = replace(snapshot, fleets=(first, *snapshot.fleets[1:]), host_pools={"local": (used, max(used, 2))})
    ds = [d for g in schedule(snap, 100.0).gangs for d in g.decisions]
    reclaimed = {d.instance_id for d in ds if isinstance(d, Reclaim)}
    by_id = {i.id: i for i in insts}
    assert all(by_id[r].status == "idle" for r in reclaimed)
    assert not reclaimed & {d.instance_id for d in ds if isinstance(d, Assign)}


def test_a_reuse_only_run_waits_for_its_fleets_busy_instances() -> None:
    full = fleet((inst(0, status="busy", busy=1),), nodes_max=None)
    reuse = replace(job(1), creation_policy="reuse")
    assert waits(Snapshot(fleets=(full,), queue=(reuse,)))["j1-0"] == (
        "Waiting for capacity: fleet 'f': its instances are busy and `creation_policy: reuse` allows no new ones"
    )


def test_a_machine_short_of_blocks_names_the_smallest_share_the_job_could_use() -> None:
    host = InstanceResources(cpus=8, memory_mib=32768, gpus=(), disk_size_mib=100_000, cpu_arch="x86")
    three_cpus = replace(SMALL, cpu_count=Range(3, None))
    snap = Snapshot(
        fleets=(local_fleet(host, 4, nodes_max=None),), queue=(job(1, req=three_cpus),), host_pools={"local": (3, 4)}
    )
    assert waits(snap)["j1-0"] == (
        "Waiting for capacity: fleet 'f': this machine has 1 of its 4 blocks free and a local instance for the job"
        " needs 2"
    )


def test_of_two_fleets_with_new_instances_the_cheaper_one_is_used() -> None:
    cheap = Offer("aws", "a", "x", 1.0, MACHINE)
    dear = Offer("aws", "b", "x", 2.0, MACHINE)
    snap = Snapshot(
        fleets=(fleet(name="cheap", fid="c", offers=(cheap,)), fleet(name="dear", fid="d", offers=(dear,))),
        queue=(job(1),),
    )
    (reserve,) = [d for g in schedule(snap, 100.0).gangs for d in g.decisions]
    assert isinstance(reserve, Reserve) and reserve.fleet_id == "c"
    swapped = replace(snap, fleets=snap.fleets[::-1])
    (reserve,) = [d for g in schedule(swapped, 100.0).gangs for d in g.decisions]
    assert isinstance(reserve, Reserve) and reserve.fleet_id == "c"


def test_a_fleet_the_runs_options_leave_empty_is_named_with_those_options() -> None:
    f = fleet(offers=(Offer("aws", "m7i", "eu-west-1", 1.0, MACHINE),))
    in_us = replace(job(1), regions=frozenset({"us-east-1"}))
    assert refusal(in_us, Snapshot((f,), ())) == (
        "No fleet can ever run this job: fleet 'f': the run's `regions` leave(s) none of its instances or offers"
    )
    spot = replace(job(1), spot=True)
    assert "the run's `spot_policy` leave(s) none" in (refusal(spot, Snapshot((f,), ())) or "")
    # network volumes in another region: the message names them and where they are
    vols = replace(in_us, zones=frozenset({"us-east-1b"}), volumes_where="data (us-east-1 us-east-1b)")
    assert (refusal(vols, Snapshot((f,), ())) or "").endswith(
        "`volumes` leave(s) none of its instances or offers (the volumes: data (us-east-1 us-east-1b))"
    )
    assert (refusal(replace(vols, volumes_where=""), Snapshot((f,), ())) or "").endswith("instances or offers")


def test_a_fleet_with_no_instances_left_and_no_offers_can_never_run_anything() -> None:
    ending = fleet((inst(0, status="terminating"),), offers=())
    assert refusal(job(1), Snapshot((ending,), ())) == (
        "No fleet can ever run this job: fleet 'f': it has no instances and cannot create any"
    )
    assert refusal(job(1), Snapshot((fleet(),), ())) is None


def test_a_gang_past_hold_after_is_worked_out_again_and_holds_its_fleet() -> None:
    # the first gang waits; the second, of the same kind but waiting past hold_after, is not told the first
    # one's wait as is: it holds the fleet, which a third then finds held
    full = fleet((inst(0, status="busy", busy=1),), nodes_max=1)
    first = replace(job(1, priority=5), submitted_at=90.0)
    old = replace(job(2), submitted_at=10.0)
    third = replace(job(3), submitted_at=95.0)
    told = waits(Snapshot(fleets=(full,), queue=(first, old, third), hold_after=50.0))
    assert told["j1-0"] == told["j2-0"] == "Waiting for capacity: fleet 'f' has 1 of at most 1 instances, none free"
    assert told["j3-0"] == "Waiting for capacity: an earlier job that has waited long holds the fleets this job can use"
