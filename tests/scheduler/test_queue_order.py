"""A queue order kept job by job (``QueueOrder``) is, after any sequence of jobs put, changed and removed, the
order ``queue_gangs`` sorts the same jobs into, with the same gangs, each project's gangs in that order with
the kinds they are (and of each kind the first gang past the starvation guard after a place), and its earliest
submission, earliest retry deadline and jobs that may not wait are those of the jobs it holds."""

from __future__ import annotations

import operator
from dataclasses import replace
from functools import partial

from hypothesis import given, settings
from hypothesis import strategies as st
from test_pass_memo import TWO_CPUS
from test_schedule import SMALL, job

from corral.domain.selectors import Selector
from corral.scheduler.pass_memo import stable_kind
from corral.scheduler.queue_order import QueueOrder
from corral.scheduler.schedule import queue_gangs
from corral.scheduler.types import QueuedJob, WaitPolicy

#: (job, run, replica, job number, priority, submitted at, deadline or None, may wait)
Spec = tuple[int, int, int, int, int, int, "int | None", bool]
_JOB = st.tuples(
    st.integers(0, 12),
    st.integers(0, 3),
    st.integers(0, 1),
    st.integers(0, 2),
    st.integers(-1, 2),
    st.integers(0, 4),
    st.none() | st.integers(0, 9),
    st.booleans(),
)


def _job(spec: Spec) -> QueuedJob:
    k, run, replica, num, priority, submitted, deadline, may_wait = spec
    return replace(
        job(submitted, priority=priority, run=f"r{run}", num=num),
        id=f"job{k}",
        project_id=f"p{run % 2}",
        project_name=f"project {run % 2}",
        requirements=SMALL if k % 3 else TWO_CPUS,
        selectors=(Selector(name="x-0"),) if k % 5 == 0 else None,  # a gang of no kind
        replica_num=replica,
        wait=WaitPolicy(may_wait, None if deadline is None else float(deadline)),
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), _JOB), max_size=40))
def test_a_kept_order_is_the_sorted_order_of_the_jobs_it_holds(steps: list[tuple[bool, Spec]]) -> None:
    kept = QueueOrder()
    jobs: dict[str, QueuedJob] = {}
    for put, spec in steps:
        j = _job(spec)
        if put:
            kept.put(j)
            jobs[j.id] = j
        else:
            kept.remove(j.id)
            jobs.pop(j.id, None)
    assert len(kept) == len(jobs)
    assert list(kept.gangs()) == list(queue_gangs(jobs.values()).items())
    for gang, members in queue_gangs(jobs.values()).items():
        assert kept.gang_jobs(gang) == members
        assert kept.gang_place(gang)[-1] == members[0].id
    gangs = queue_gangs(jobs.values())
    projects = {j.project_id for j in jobs.values()}
    assert set(kept.projects()) == projects
    assert kept.project_names() == {j.project_id: j.project_name for j in jobs.values()}
    for pid in projects:
        own = [(g, members) for g, members in gangs.items() if members[0].project_id == pid]
        assert list(kept.project_gangs(pid)) == own
        by_kind: dict[object, list[str]] = {}
        for _, members in own:
            by_kind.setdefault(stable_kind(members), []).append(members[0].id)
        assert {k: [p[-1] for p in places] for k, places in kept.kind_places(pid).items()} == by_kind
    # of each kind the first gang after a place that waited past the guard, of no kind every one
    for cutoff in (0, 2, 4):
        for pid in projects:
            for kind, places in kept.kind_places(pid).items():
                for after in [None, *places]:
                    later = [p for p in places if (after is None or p > after) and p[1] <= cutoff]
                    found = kept.waited_places(pid, kind, after, partial(operator.ge, cutoff))
                    assert found == (later[:1] if kind is not None else later)
    assert kept.first_submitted() == min((j.submitted_at for j in jobs.values()), default=None)
    deadlines = [j.wait.deadline for j in jobs.values() if j.wait.deadline is not None]
    assert kept.first_deadline() == min(deadlines, default=None)
    assert kept.all_may_wait() == all(j.wait.may_wait for j in jobs.values())
    assert all(kept.get(job_id) == j for job_id, j in jobs.items())
    assert dict(kept.jobs) == jobs


def test_a_gang_stands_where_its_first_job_does_and_a_priority_change_moves_it() -> None:
    kept = QueueOrder([job(1), job(2), job(3)])
    assert [g for g, _ in kept.gangs()] == [("r1", 0), ("r2", 0), ("r3", 0)]
    kept.put(replace(job(3), priority=5))
    assert [g for g, _ in kept.gangs()] == [("r3", 0), ("r1", 0), ("r2", 0)]
    kept.remove("j1-0")
    kept.remove("j1-0")  # gone already: nothing
    assert [g for g, _ in kept.gangs()] == [("r3", 0), ("r2", 0)]
