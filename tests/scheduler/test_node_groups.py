"""Heterogeneous gangs (a task's node ``groups``): every job of the gang is screened against a fleet, not
only the master; the most constrained job picks its instance first; the gang is placed whole or waits;
and the ``${{ groups[i].nodes[j].IP_ADDRESS }}`` references (``corral.domain.node_groups``)."""

from __future__ import annotations

from dataclasses import replace

from test_schedule import SMALL, fleet, inst, job
from test_wait_reasons import GPU_HOST, HOST, ONE_GPU

from corral.domain.node_groups import addresses_view, check_refs, fill_refs, refs
from corral.domain.resources import Requirements
from corral.scheduler.schedule import schedule
from corral.scheduler.types import Assign, Fail, QueuedJob, Snapshot, Wait


def _gang(reqs: list[Requirements]) -> tuple[QueuedJob, ...]:
    return tuple(
        replace(job(1, run="ray", nodes=len(reqs), num=n), requirements=r, multinode=True) for n, r in enumerate(reqs)
    )


def test_the_gpu_node_gets_the_gpu_host_though_the_cpu_node_comes_first() -> None:
    cluster = fleet((inst(0, res=GPU_HOST), inst(1, res=HOST)), offers=(), placement="cluster")
    snap = Snapshot(fleets=(cluster,), queue=_gang([SMALL, ONE_GPU]))
    decisions = [d for g in schedule(snap, 100.0).gangs for d in g.decisions]
    assert {d.job_id: d.instance_id for d in decisions if isinstance(d, Assign)} == {"j1-0": "i1", "j1-1": "i0"}


def test_a_group_that_can_never_fit_fails_the_gang_at_once() -> None:
    cpu_only = fleet((inst(0, res=HOST), inst(1, res=HOST)), offers=(), placement="cluster")
    snap = Snapshot(fleets=(cpu_only,), queue=_gang([SMALL, ONE_GPU]))
    decisions = [d for g in schedule(snap, 100.0).gangs for d in g.decisions]
    assert all(isinstance(d, Fail) for d in decisions) and len(decisions) == 2
    assert "job 1:" in decisions[0].message, decisions[0]  # type: ignore[union-attr]


def test_the_gang_waits_whole_while_the_gpu_host_is_busy() -> None:
    cluster = fleet((inst(0, res=GPU_HOST, status="busy", busy=1), inst(1, res=HOST)), offers=(), placement="cluster")
    snap = Snapshot(fleets=(cluster,), queue=_gang([SMALL, ONE_GPU]))
    decisions = [d for g in schedule(snap, 100.0).gangs for d in g.decisions]
    assert decisions and all(isinstance(d, Wait) for d in decisions), decisions


def test_group_address_references() -> None:
    command = "ray start --address=${{ groups[0].nodes[0].IP_ADDRESS }}:6379 # $${{ groups[9].nodes[9].IP_ADDRESS }}"
    assert refs(command) == [(0, 0)]
    view = addresses_view([(0, 0, "10.0.0.1"), (1, 1, "10.0.0.3"), (1, 0, "10.0.0.2")])
    assert view == [["10.0.0.1"], ["10.0.0.2", "10.0.0.3"]]
    assert fill_refs(command, view).startswith("ray start --address=10.0.0.1:6379 # $${{")
    assert check_refs(command, [1, 2]) is None
    assert "out of range" in (check_refs("${{ groups[1].nodes[2].IP_ADDRESS }}", [1, 2]) or "")
    assert "illegal reference" in (check_refs("${{ groups[0].node[0].IP_ADDRESS }}", [1]) or "")
    assert check_refs("${{ secrets.TOKEN }} ${{ run.args }}", [1]) is None


def test_max_price_and_backends_narrow_what_a_job_may_use() -> None:
    from test_schedule import OFFER

    dear = replace(OFFER, backend="aws", price=2.5)
    priced = fleet(offers=(dear,))
    capped = replace(job(1), max_price=1.0)
    (decision,) = [d for g in schedule(Snapshot(fleets=(priced,), queue=(capped,)), 100.0).gangs for d in g.decisions]
    assert isinstance(decision, Fail) and "above the run's `max_price` ($1/h)" in decision.message, decision
    cheap_enough = replace(job(2), max_price=3.0)
    decisions = [
        d for g in schedule(Snapshot(fleets=(priced,), queue=(cheap_enough,)), 100.0).gangs for d in g.decisions
    ]
    assert [type(d).__name__ for d in decisions] == ["Reserve"]
    only_aws = replace(job(3), backends=frozenset({"aws"}))
    local = fleet((replace(inst(0), backend="local"),), offers=(OFFER,))
    (decision,) = [d for g in schedule(Snapshot(fleets=(local,), queue=(only_aws,)), 100.0).gangs for d in g.decisions]
    assert isinstance(decision, Fail) and "does not list its backends (remote)" in decision.message, decision
