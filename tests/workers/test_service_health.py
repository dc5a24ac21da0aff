"""A service's replica failures (pure): a replica that failed after it ran is submitted again with backoff
whatever its `retry` says; the service fails only when no replica was ready for `retry.duration`, counted
from its submission or the last time any replica was ready."""

from __future__ import annotations

from corral.domain.retry import Submission
from corral.store.run_states import JobState
from corral.workers.service_health import plan_service


def _job(replica: int, status: str, ready: bool, ready_at: float | None = None, reason: str | None = None) -> JobState:
    return JobState(
        replica,
        0,
        0,
        status,
        None,
        None,
        f"j{replica}",
        reason,
        True,
        0.0,
        50.0 if status == "failed" else None,
        ready,
        ready_at,
    )


def _plan(jobs: list[JobState], now: float, retry: dict[str, object] | None = None, failures: int = 1):  # type: ignore[no-untyped-def]
    latest = {(j.replica_num, 0): j for j in jobs}
    hist = {
        (j.replica_num, 0): [Submission(0.0, 50.0 if j.status == "failed" else None, True)] * failures for j in jobs
    }
    return plan_service(latest, hist, tuple(jobs), {j.id: retry for j in jobs}, 0.0, now)


def test_a_crashed_replica_is_resubmitted_without_retry_while_another_serves() -> None:
    jobs = [_job(0, "failed", False, reason="container_exited_with_error"), _job(1, "running", True, 90.0)]
    plan = _plan(jobs, now=100.0)
    assert plan.resubmit == (0,) and plan.due == 50.0 and not plan.give_up and plan.check_at is None


def test_a_crash_loop_backs_off() -> None:
    jobs = [_job(0, "failed", False, reason="container_exited_with_error"), _job(1, "running", True, 90.0)]
    assert _plan(jobs, now=100.0, failures=4).due > 50.0


def test_no_replica_ready_for_the_retry_duration_fails_the_service() -> None:
    jobs = [_job(0, "running", False), _job(1, "running", False)]
    plan = _plan(jobs, now=30.0, retry={"duration": 60})
    assert not plan.give_up and plan.check_at == 60.0
    assert _plan(jobs, now=61.0, retry={"duration": 60}).give_up
    assert not _plan(jobs, now=3000.0).give_up and _plan(jobs, now=3601.0).give_up  # default: one hour


def test_a_replica_once_ready_resets_the_clock() -> None:
    jobs = [_job(0, "running", False, ready_at=500.0), _job(1, "running", False)]
    assert not _plan(jobs, now=550.0, retry={"duration": 60}).give_up
    assert _plan(jobs, now=561.0, retry={"duration": 60}).give_up
    jobs = [_job(0, "running", True, ready_at=500.0)]
    assert not _plan(jobs, now=10_000.0, retry={"duration": 60}).give_up  # ready now


def _unplaced(plan_jobs: list[JobState], unplaced: set[int], now: float):  # type: ignore[no-untyped-def]
    latest = {(j.replica_num, 0): j for j in plan_jobs}
    hist = {
        (j.replica_num, 0): [Submission(0.0, 50.0 if j.status == "failed" else None, j.replica_num not in unplaced)]
        for j in plan_jobs
    }
    return plan_service(latest, hist, tuple(plan_jobs), {j.id: None for j in plan_jobs}, 0.0, now)


def test_a_replica_without_capacity_waits_again_while_another_serves() -> None:
    no_capacity = "failed_to_start_due_to_no_capacity"
    jobs = [_job(0, "running", True, 90.0), _job(1, "failed", False, reason=no_capacity)]
    assert _unplaced(jobs, {1}, now=100.0).resubmit == (1,)
    # when no replica was ever placed (nothing fits), the service is not kept retrying: the run fails
    jobs = [_job(0, "failed", False, reason=no_capacity), _job(1, "failed", False, reason=no_capacity)]
    assert _unplaced(jobs, {0, 1}, now=100.0).resubmit == ()
    # another failure before placement (its secrets, say) is not retried either
    jobs = [_job(0, "running", True, 90.0), _job(1, "failed", False, reason="terminated_by_server")]
    assert _unplaced(jobs, {1}, now=100.0).resubmit == ()


def test_a_preempted_replica_is_resubmitted_at_once() -> None:
    from dataclasses import replace

    from corral.store.run_states import RunState
    from corral.workers.runs import _histories

    preempted = replace(_job(0, "failed", False, reason="interrupted_by_no_capacity"), preempted=True)
    serving = _job(1, "running", True, 90.0)
    hist = _histories(RunState("r", "running", None, None, (preempted, serving)))
    assert hist[(0, 0)] == []  # a preemption starts the replica's history afresh
    latest = {(0, 0): preempted, (1, 0): serving}
    plan = plan_service(latest, hist, (preempted, serving), {}, 0.0, 100.0)
    assert plan.resubmit == (0,) and plan.due == 0.0 and not plan.give_up
