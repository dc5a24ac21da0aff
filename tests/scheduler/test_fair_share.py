"""Fair share in the pure pass against a small reference: projects sharing one exported fleet of GPU
hosts, each with a weight, a nominal quota, GPUs already held and a backlog of one-GPU jobs, get exactly
what discrete weighted progressive filling gives (the next GPU to the project with the lowest
(held - nominal)+ / capacity / weight, then higher priority, then the older head); every free GPU is
used while any project waits (work-conserving); within a project, priority then age; no shares: the
queue order as before."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from test_schedule import GPU_MACHINE, fleet, inst, job
from test_wait_reasons import ONE_GPU

from corral.domain.quotas import limits_from_doc
from corral.scheduler.fair_share import FairNote, ShareBook
from corral.scheduler.schedule import schedule
from corral.scheduler.types import Assign, FairShare, Offer, Reclaim, Reserve, Snapshot, Wait
from corral.services.quotas import wait_reason

PROJECTS = ("a", "b", "c")


def _reference(
    free: int, capacity: int, demand: dict[str, list[tuple[int, float]]], shares: dict[str, FairShare]
) -> dict[str, int]:
    """Discrete weighted progressive filling, one GPU at a time."""
    held = {p: shares[p].used.get("gpu", 0.0) for p in demand}
    queues = {p: sorted(d, key=lambda x: (-x[0], x[1])) for p, d in demand.items()}
    got = dict.fromkeys(demand, 0)

    def share(p: str) -> float:
        return max(0.0, held[p] - (shares[p].nominal.get("gpu") or 0.0)) / capacity / shares[p].weight

    while free > 0 and any(queues.values()):
        p = min((p for p in queues if queues[p]), key=lambda p: (share(p), -queues[p][0][0], queues[p][0][1]))
        queues[p].pop(0)
        held[p] += 1
        got[p] += 1
        free -= 1
    return got


@st.composite
def contended(draw: st.DrawFn) -> tuple[Snapshot, int, int, dict[str, list[tuple[int, float]]]]:
    hosts = draw(st.integers(1, 4))
    busy = [draw(st.integers(0, 2)) for _ in range(hosts)]
    insts = tuple(inst(k, total=2, busy=b, status="busy" if b else "idle", res=GPU_MACHINE) for k, b in enumerate(busy))
    f = replace(fleet(insts, blocks=2, offers=()), importer_project_ids=frozenset({"b", "c"}), project_id="a")
    shares: dict[str, FairShare] = {}
    queue = []
    demand: dict[str, list[tuple[int, float]]] = {}
    n = 0
    for p in PROJECTS:
        # what one GPU of GPU_MACHINE is charged: a GPU, 8 CPUs, 32 GB (the nominal and the holding alike)
        nominal, held = draw(st.integers(0, 2)), draw(st.integers(0, 3))
        shares[p] = FairShare(
            weight=float(draw(st.sampled_from([1, 2, 3]))),
            nominal=limits_from_doc({"gpu": nominal, "cpu": 8 * nominal, "memory": 32 * nominal}),
            used={"gpu": float(held), "cpu": 8.0 * held, "memory": 32.0 * held},
        )
        for _ in range(draw(st.integers(0, 6))):
            prio = draw(st.sampled_from([0, 0, 5]))
            at = float(draw(st.integers(0, 10_000))) + n / 100  # distinct submission times
            queue.append(replace(job(n, priority=prio, req=ONE_GPU), project_id=p, project_name=p, submitted_at=at))
            demand.setdefault(p, []).append((prio, at))
            n += 1
    free = sum(2 - b for b in busy)
    return Snapshot(fleets=(f,), queue=tuple(queue), shares=shares), free, hosts * 2, demand


@settings(max_examples=150, deadline=None)
@given(contended())
def test_fair_share_matches_weighted_progressive_filling(
    case: tuple[Snapshot, int, int, dict[str, list[tuple[int, float]]]],
) -> None:
    snapshot, free, capacity, demand = case
    plan = schedule(snapshot, 0.0)
    assert plan == schedule(snapshot, 0.0, reuse=False)
    project_of = {j.id: j.project_id for j in snapshot.queue}
    got = dict.fromkeys(demand, 0)
    for g in plan.gangs:
        for d in g.decisions:
            if isinstance(d, Assign):
                got[project_of[d.job_id]] += 1
    assert got == _reference(free, capacity, demand, dict(snapshot.shares))
    assert sum(got.values()) == min(free, len(snapshot.queue))  # work-conserving


def test_weights_split_freed_capacity_one_to_three_and_order_within_a_project_is_kept() -> None:
    insts = tuple(inst(k, total=2, res=GPU_MACHINE) for k in range(4))  # 8 free GPUs
    f = replace(fleet(insts, blocks=2, offers=()), importer_project_ids=frozenset({"b"}), project_id="a")
    queue = [
        replace(job(n, req=ONE_GPU, priority=n % 2), project_id="a", project_name="a", submitted_at=float(n))
        for n in range(10)
    ]
    queue += [
        replace(job(100 + n, req=ONE_GPU), project_id="b", project_name="b", submitted_at=50.0 + n) for n in range(10)
    ]
    shares = {"a": FairShare(weight=1.0), "b": FairShare(weight=3.0)}
    plan = schedule(Snapshot(fleets=(f,), queue=tuple(queue), shares=shares), 0.0)
    placed = [d.job_id for g in plan.gangs for d in g.decisions if isinstance(d, Assign)]
    assert sum(j.startswith("j1") and len(j) > 4 for j in placed) == 6  # b (weight 3) gets 6 of 8
    a_jobs = [j for j in placed if not (j.startswith("j1") and len(j) > 4)]
    assert a_jobs == ["j1-0", "j3-0"]  # a's two: its higher priority first, then the older
    # without shares the queue order (priority, then age) takes all eight: b's jobs came later
    plain = schedule(Snapshot(fleets=(f,), queue=tuple(queue)), 0.0)
    assert all(int(d.job_id[1:].split("-")[0]) < 100 for g in plain.gangs for d in g.decisions if isinstance(d, Assign))


def test_a_run_that_waits_behind_a_project_further_below_its_entitlement_says_fair_share() -> None:
    # one free GPU of four; a holds 1 (weight 1), b holds 2 (weight 3): b is further below, so it takes
    # the GPU and a's run waits for fair share, naming b; b's second run waits for capacity alone
    insts = (inst(0, total=2, busy=1, status="busy", res=GPU_MACHINE), inst(1, total=2, busy=2, res=GPU_MACHINE))
    f = replace(fleet(insts, blocks=2, offers=()), importer_project_ids=frozenset({"b"}), project_id="a")
    queue = (
        replace(job(0, req=ONE_GPU), project_id="a", project_name="team-a", submitted_at=1.0),
        replace(job(1, req=ONE_GPU), project_id="b", project_name="team-b", submitted_at=2.0),
        replace(job(2, req=ONE_GPU), project_id="b", project_name="team-b", submitted_at=3.0),
    )
    held = {"gpu": 1.0, "cpu": 8.0, "memory": 32.0}
    shares = {
        "a": FairShare(weight=1.0, used=held),
        "b": FairShare(weight=3.0, used={k: 2 * v for k, v in held.items()}),
    }
    plan = schedule(Snapshot(fleets=(f,), queue=queue, shares=shares), 0.0)
    decisions = {d.job_id: d for g in plan.gangs for d in g.decisions if not isinstance(d, Reclaim)}
    assert isinstance(decisions["j1-0"], Assign)
    a_wait = decisions["j0-0"]
    assert isinstance(a_wait, Wait)
    assert a_wait.message.startswith(
        "Waiting for capacity (fair share: project 'team-b' is further below its entitlement): "
    )
    assert wait_reason(a_wait.message) == "fair_share"
    b_wait = decisions["j2-0"]
    assert isinstance(b_wait, Wait) and "fair share" not in b_wait.message
    assert wait_reason(b_wait.message) == "capacity"
    # without shares nobody waits for fair share
    plain = schedule(Snapshot(fleets=(f,), queue=queue), 0.0)
    assert all("fair share" not in getattr(d, "message", "") for g in plain.gangs for d in g.decisions)


def test_instances_count_in_a_share_only_where_the_nominal_quota_names_them() -> None:
    """One job on a block of an instance holds the whole instance in an instance count: counted, two jobs of
    weight 3 on two of two hosts (all the instances) would outweigh one job of weight 1, and the weight-1
    project would take both freed GPUs; GPUs alone give the second one to the weight-3 project (1:3)."""
    insts = tuple(inst(k, total=2, busy=1, status="busy", res=GPU_MACHINE) for k in range(2))  # 2 free GPUs
    f = replace(fleet(insts, blocks=2, offers=()), importer_project_ids=frozenset({"b"}), project_id="a")
    queue = [replace(job(n, req=ONE_GPU), project_id="a", project_name="a", submitted_at=float(n)) for n in range(3)]
    queue += [
        replace(job(100 + n, req=ONE_GPU), project_id="b", project_name="b", submitted_at=50.0 + n) for n in range(3)
    ]
    on_both = frozenset(i.id for i in insts)
    held = {"gpu": 2.0, "cpu": 16.0, "memory": 64.0, "instances": 2.0}
    shares = {"a": FairShare(weight=1.0), "b": FairShare(weight=3.0, used=held, instance_ids=on_both)}
    plan = schedule(Snapshot(fleets=(f,), queue=tuple(queue), shares=shares), 0.0)
    placed = sorted(d.job_id for g in plan.gangs for d in g.decisions if isinstance(d, Assign))
    assert placed == ["j0-0", "j100-0"], placed


def _book() -> ShareBook:
    mine = fleet((inst(0, res=GPU_MACHINE), inst(1, status="terminating", res=GPU_MACHINE)), fid="fa", name="fa")
    setting_up = replace(inst(2), resources=None)
    theirs = replace(fleet((inst(3, fleet="fb", res=GPU_MACHINE),), fid="fb", name="fb"), project_id="other")
    mine = replace(mine, instances=(*mine.instances, setting_up))
    return ShareBook(Snapshot((mine, theirs), (), shares={"p": FairShare(nominal=limits_from_doc({"gpu": 0}))}))


def test_capacity_counts_the_projects_live_instances_with_known_resources_only() -> None:
    cap = _book().capacity("p")
    assert cap["gpu"] == 2 and cap["instances"] == 1 and "price_per_hour" not in cap


def test_a_reservation_for_a_job_raises_the_share_and_one_for_a_fleet_does_not() -> None:
    book = _book()
    before, generation = book.share("p"), book.generation
    book.take("p", [Reserve("fa", Offer("aws", "p5", "x", 1.0, GPU_MACHINE), 1, 1)])  # upkeep: no job
    book.take("p", [Assign("j", "i2", 1), Assign("j", "gone", 1)])  # nothing known to charge
    assert book.generation == generation and book.share("p") == before
    book.take("p", [Reserve("fa", Offer("aws", "p5", "x", 1.0, GPU_MACHINE), 1, 1, job_id="j")])
    assert book.generation == generation + 1 and book.used["p"]["instances"] == 1
    assert book.share("p") > before


def test_a_project_is_remembered_at_its_lowest_share_and_with_every_fleet_its_gangs_could_use() -> None:
    book = _book()
    earlier: dict[str, tuple[str, float, set[str]]] = {}
    head = replace(job(1), project_name="alpha")
    assert FairNote(head, book, earlier, lambda: {"fa"}).record()
    assert earlier["p"] == ("alpha", book.share("p"), {"fa"})
    assert not FairNote(head, book, earlier, lambda: {"fa"}).record()  # nothing new
    assert FairNote(head, book, earlier, lambda: {"fb"}).record()  # another fleet
    assert earlier["p"][2] == {"fa", "fb"}
    earlier["p"] = ("alpha", 5.0, {"fa"})  # remembered higher than now
    assert FairNote(head, book, earlier, lambda: {"fc"}).record()
    assert earlier["p"] == ("alpha", book.share("p"), {"fa", "fc"})
