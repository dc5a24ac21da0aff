"""A gang that waits as the gang before it did gets its wait without being worked out again
(``scheduler.wait_repeat``), and the plan is exactly the one of working every gang out afresh
(``reuse=False``): on backlogs of long runs of one kind of job per project, with fair share, quotas,
jobs that may not wait, retry deadlines that have or have not passed, the starvation guard, and jobs that
already carry the message they would be given (the commit point writes it; no decision repeats it)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from test_schedule import GPU_MACHINE, SMALL, fleet, inst, job
from test_wait_reasons import ONE_GPU

from corral.domain.quotas import limits_from_doc
from corral.scheduler.schedule import schedule
from corral.scheduler.types import FairShare, ProjectQuota, Snapshot, Wait, WaitPolicy

PROJECTS = ("a", "b", "c")
NOW = 100.0


@st.composite
def backlogs(draw: st.DrawFn) -> Snapshot:
    hosts = draw(st.integers(1, 3))
    busy = [draw(st.integers(0, 2)) for _ in range(hosts)]
    insts = tuple(inst(k, total=2, busy=b, status="busy" if b else "idle", res=GPU_MACHINE) for k, b in enumerate(busy))
    f = replace(fleet(insts, blocks=2, offers=()), importer_project_ids=frozenset({"b", "c"}), project_id="a")
    queue = []
    n = 0
    for p in PROJECTS:
        for _ in range(draw(st.integers(0, 3))):  # runs of one kind, of a few sizes
            req = draw(st.sampled_from([ONE_GPU, SMALL]))
            for _ in range(draw(st.integers(1, 8))):
                at = float(draw(st.integers(0, 99))) + n / 1000
                j = replace(job(n, priority=draw(st.sampled_from([0, 0, 0, 5])), req=req), project_id=p,
                            project_name=p, submitted_at=at)  # fmt: skip
                deadline = draw(st.sampled_from([None, None, None, 50.0, 500.0]))
                j = replace(j, wait=WaitPolicy(draw(st.sampled_from([True, True, True, False])), deadline=deadline))
                queue.append(j)
                n += 1
    shares = {
        p: FairShare(weight=float(draw(st.sampled_from([1, 2, 3]))), nominal=limits_from_doc({}), used={})
        for p in PROJECTS
    }
    quotas = {
        p: ProjectQuota(limits_from_doc({"gpu": draw(st.integers(0, 3))}), {"gpu": 0.0}, frozenset(), p)
        for p in PROJECTS
        if draw(st.booleans())
    }
    snap = Snapshot(
        fleets=(f,),
        queue=tuple(queue),
        shares=shares if draw(st.booleans()) else {},
        quotas=quotas,
        hold_after=draw(st.sampled_from([None, None, 30.0, 90.0])),
    )
    # the messages an earlier pass wrote: a job that already has its message is not decided again
    first = schedule(snap, NOW)
    said = {d.job_id: d.message for g in first.gangs for d in g.decisions if isinstance(d, Wait)}
    kept = [replace(j, status_message=said.get(j.id)) if draw(st.booleans()) else j for j in queue]
    return replace(snap, queue=tuple(kept))


@settings(max_examples=200, deadline=None)
@given(backlogs())
def test_repeated_waits_give_the_plan_of_working_each_gang_out_afresh(snapshot: Snapshot) -> None:
    assert schedule(snapshot, NOW) == schedule(snapshot, NOW, reuse=False)


def test_a_long_backlog_of_one_kind_waits_with_one_message_and_no_repeats() -> None:
    insts = tuple(inst(k, total=2, busy=2, status="busy", res=GPU_MACHINE) for k in range(2))
    f = replace(fleet(insts, blocks=2, offers=()), importer_project_ids=frozenset({"b"}), project_id="a")
    queue = tuple(
        replace(job(i, req=ONE_GPU), project_id=p, project_name=p, submitted_at=float(i))
        for i, p in enumerate(["a"] * 50 + ["b"] * 50)
    )
    shares = {p: FairShare(weight=w, nominal=limits_from_doc({}), used={"gpu": 2.0 if p == "a" else 0.0})
              for p, w in (("a", 1.0), ("b", 3.0))}  # fmt: skip
    snap = Snapshot(fleets=(f,), queue=queue, shares=shares)
    plan = schedule(snap, NOW)
    assert plan == schedule(snap, NOW, reuse=False)
    messages = {d.message for g in plan.gangs for d in g.decisions if isinstance(d, Wait)}
    assert len([d for g in plan.gangs for d in g.decisions]) == 100 and len(messages) == 2  # one per project
    # once written, nothing is decided again
    said = {d.job_id: d.message for g in plan.gangs for d in g.decisions if isinstance(d, Wait)}
    again = replace(snap, queue=tuple(replace(j, status_message=said[j.id]) for j in queue))
    assert schedule(again, NOW).gangs == ()
