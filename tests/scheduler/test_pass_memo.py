"""What one pass of ``schedule()`` reuses from gang to gang never changes the plan: the same decisions and
messages as working every gang out afresh (``reuse=False``), on queues that repeat a few shapes of job over
fleets of several kinds (instances of two sizes, a shared host carved into blocks, backend caps, held
fleets, gangs of several nodes, ``creation_policy: reuse``, ``max_price``), and no job decided twice."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from test_schedule import GPU_MACHINE, MACHINE, SMALL, fleet, inst, job
from test_wait_reasons import HOST, ONE_GPU, local_fleet

from corral.domain.resources import Range
from corral.scheduler.schedule import schedule
from corral.scheduler.types import Assign, Offer, Reserve, Snapshot, WaitPolicy

TWO_CPUS = replace(SMALL, cpu_count=Range(2, None))
BIG = replace(SMALL, cpu_count=Range(12, None))


@st.composite
def busy_queues(draw: st.DrawFn) -> Snapshot:
    fleets = []
    for fi in range(draw(st.integers(1, 4))):
        name = f"f{fi}"
        if draw(st.integers(0, 4)) == 0:
            fleets.append(
                local_fleet(
                    HOST, draw(st.sampled_from([1, 2, 4])), name=name, nodes_max=draw(st.sampled_from([None, 1, 3]))
                )
            )
            continue
        res = draw(st.sampled_from([MACHINE, GPU_MACHINE]))
        total = draw(st.sampled_from([1, 2, 4]))
        nodes_max = draw(st.one_of(st.none(), st.integers(0, 4)))
        insts = tuple(
            replace(
                inst(fi * 10 + k, fleet=name, status=draw(st.sampled_from(["idle", "idle", "busy", "pending"])),
                     busy=draw(st.integers(0, total)), total=total, res=res),
                price=draw(st.sampled_from([0.0, 1.0])),
            )
            for k in range(draw(st.integers(0, nodes_max if nodes_max is not None else 3)))
        )  # fmt: skip
        price = draw(st.sampled_from([0.5, 2.0, 4.0]))
        offers = (Offer("ssh", "ssh", "remote", price, res),) if draw(st.booleans()) else ()
        slot = fleet(insts, nodes_max=nodes_max, name=name, fid=name, blocks=total, offers=offers,
                     placement=draw(st.sampled_from(["any", "cluster"])))  # fmt: skip
        if draw(st.booleans()):
            slot = replace(slot, backend_limit_key="ssh")
        fleets.append(slot)
    queue = []
    for i in range(draw(st.integers(0, 25))):
        req = draw(st.sampled_from([SMALL, SMALL, TWO_CPUS, ONE_GPU, BIG]))
        nodes = draw(st.sampled_from([1, 1, 1, 2]))
        policy = draw(st.sampled_from(["reuse-or-create", "reuse-or-create", "reuse"]))
        may_wait = draw(st.booleans())
        max_price = draw(st.sampled_from([None, None, 1.0]))
        for n in range(nodes):
            j = job(i, priority=draw(st.integers(0, 2)), req=req, may_wait=may_wait, nodes=nodes, num=n, policy=policy)
            queue.append(
                replace(
                    j,
                    max_price=max_price,
                    wait=WaitPolicy(may_wait, deadline=draw(st.sampled_from([None, 50.0, 500.0]))),
                )
            )
    return Snapshot(
        fleets=tuple(fleets),
        queue=tuple(queue),
        backend_limits={"ssh": (draw(st.integers(0, 2)), draw(st.integers(1, 4)))},
        host_pools={"local": (draw(st.integers(0, 2)), 4)},
        hold_after=draw(st.sampled_from([None, 0.0, 5.0])),
    )  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(busy_queues())
def test_reusing_within_a_pass_gives_the_plan_of_working_each_gang_out_afresh(snapshot: Snapshot) -> None:
    reused, afresh = schedule(snapshot, 100.0), schedule(snapshot, 100.0, reuse=False)
    assert reused == afresh
    decided = Counter(getattr(d, "job_id", None) for g in reused.gangs for d in g.decisions)
    del decided[None]  # reclaims name an instance, not a job
    assert max(decided.values(), default=0) <= 1


def test_a_sweep_of_one_shape_is_placed_in_order_and_the_rest_wait_with_one_message() -> None:
    fleets = tuple(
        fleet(tuple(inst(f * 100 + k, fleet=f"f{f}", total=2) for k in range(5)), nodes_max=5, name=f"f{f}",
              fid=f"f{f}", blocks=2)
        for f in range(4)
    )  # fmt: skip
    snap = Snapshot(fleets=fleets, queue=tuple(job(i) for i in range(100)))
    plan = schedule(snap, 100.0)
    decisions = [d for g in plan.gangs for d in g.decisions]
    placed = [d for d in decisions if isinstance(d, (Assign, Reserve))]
    assert len(placed) == 40 and [d.job_id for d in placed] == [f"j{i}-0" for i in range(40)]
    waits = {getattr(d, "message", "") for d in decisions[40:]}
    assert len(waits) == 1 and all(
        f"fleet 'f{f}' has 5 of at most 5 instances, none free" in next(iter(waits)) for f in range(4)
    )
    assert plan == schedule(snap, 100.0, reuse=False)
