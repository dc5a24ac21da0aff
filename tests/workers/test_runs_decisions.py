"""The runs worker's pure decisions: a run's next status from its jobs, and what ``retry`` makes of
failed jobs (resubmit a replica, with backoff; fail; retry limit exceeded)."""

from __future__ import annotations

import dataclasses

from corral.domain.retry import Submission
from corral.domain.statuses import RunTerminationReason
from corral.store.run_states import JobState, RunState
from corral.workers.runs import RetryPlan, decide_run, plan_retry, retried_whole, settle

ON_ERROR = {"on_events": ["error"], "duration": 60}


def _job(job_num: int, status: str, reason: str | None = None, replica: int = 0) -> JobState:
    return JobState(replica, job_num, 0, status, None, None, f"j{replica}-{job_num}", reason, True, 0.0, 10.0)


def _st(*statuses: str) -> list[tuple[str, str | None]]:
    return [(x, None) for x in statuses]


def test_decide_run() -> None:
    assert decide_run("running", None, _st("done", "done")) == ("done", "all_jobs_done")
    assert decide_run("running", None, _st("failed", "running")) == ("terminating", "job_failed")
    assert decide_run("terminating", "job_failed", _st("failed", "terminated")) == ("failed", "job_failed")
    assert decide_run("submitted", None, _st("running")) == ("running", None)
    limit = RunTerminationReason.RETRY_LIMIT_EXCEEDED
    assert decide_run("running", None, _st("failed"), failure=limit) == ("failed", "retry_limit_exceeded")


def test_a_job_ended_by_its_own_limit_fails_the_run_as_in_dstack() -> None:
    for reason in ("max_duration_exceeded", "inactivity_duration_exceeded", "terminated_due_to_utilization_policy"):
        # the only job: the run fails (not terminated/stopped_by_user)
        assert decide_run("running", None, [("terminated", reason)]) == ("failed", "job_failed")
        # a multi-node run: terminating first (the other nodes are stopped), then failed
        assert decide_run("running", None, [("terminated", reason), ("running", None)]) == (
            "terminating",
            "job_failed",
        )
    # a user's stop still ends the run terminated/stopped_by_user; the server's stop of a sibling is not judged
    assert decide_run("running", None, [("terminated", "terminated_by_user")]) == ("terminated", "stopped_by_user")
    assert decide_run("terminating", "stopped_by_user", [("terminated", "max_duration_exceeded")]) == (
        "terminated",
        "stopped_by_user",
    )


def test_a_failed_node_resubmits_its_replica_even_while_another_runs() -> None:
    latest = {(0, 0): _job(0, "running"), (0, 1): _job(1, "failed", "instance_unreachable")}
    histories = {(0, 0): [Submission(0.0, None, True)], (0, 1): [Submission(0.0, 10.0, True)]}
    plan = plan_retry(latest, histories, {"j0-1": ON_ERROR}, now=11.0)
    assert plan == RetryPlan(resubmit=(0,), due=10.0)  # first failure: at once


def test_no_retry_or_a_spent_one() -> None:
    latest = {(0, 0): _job(0, "failed", "container_exited_with_error")}
    histories = {(0, 0): [Submission(0.0, 10.0, True)]}
    assert plan_retry(latest, histories, {"j0-0": None}, now=11.0) == RetryPlan()
    assert plan_retry(latest, histories, {"j0-0": ON_ERROR}, now=100.0).failure.value == "retry_limit_exceeded"


def test_a_crash_loop_backs_off() -> None:
    latest = {(0, 0): _job(0, "failed", "container_exited_with_error")}
    history = [Submission(t, t + 1, True) for t in (0.0, 2.0, 4.0)]  # three quick failures
    plan = plan_retry(latest, {(0, 0): history}, {"j0-0": ON_ERROR}, now=5.5)
    assert plan.resubmit == (0,) and plan.due == 5.0 + 2.0


def test_a_preempted_job_is_resubmitted_at_once_whatever_its_retry() -> None:
    from dataclasses import replace

    from corral.workers.runs import _histories

    preempted = replace(_job(0, "failed", "interrupted_by_no_capacity"), preempted=True)
    # no retry, or one spent long ago, or one whose events do not name interruptions: resubmitted all the same
    for retry in (None, ON_ERROR, {"on_events": ["error"], "duration": 1}):
        plan = plan_retry({(0, 0): preempted}, {}, {"j0-0": retry}, now=1e6)
        assert plan == RetryPlan(resubmit=(0,), due=0.0), retry
    # a job failing after a preemption: what failed before it and the preemption do not count against
    # retry.duration (an error at 100, preempted at 500, resubmitted at once, an error at 510)
    from corral.store.run_states import RunState

    early = replace(_job(0, "failed", "container_exited_with_error"), finished_at=100.0)
    was = replace(preempted, submission_num=1, submitted_at=100.0, finished_at=500.0)
    after = replace(_job(0, "failed", "container_exited_with_error"), submission_num=2, submitted_at=500.0)
    after = replace(after, finished_at=510.0)
    histories = _histories(RunState("r", "running", None, None, (early, was, after)))
    assert histories == {(0, 0): [Submission(500.0, 510.0, True)]}
    # counted from the failure at 510 (55 s ago, within 60), not from the one at 100 nor the preemption
    assert plan_retry({(0, 0): after}, histories, {"j0-0": ON_ERROR}, now=565.0).resubmit == (0,)


def test_a_pass_decides_each_run_at_the_time_given() -> None:
    from corral.store.run_states import RunState
    from corral.workers.runs import Loaded, RunDecision, _histories, _latest, decide_pass

    failed = _job(0, "failed", "container_exited_with_error")
    retried = RunState("retried", "running", None, None, (failed,))
    done = RunState("done", "running", None, None, (_job(0, "done"),))
    waiting = RunState("waiting", "running", None, None, (_job(0, "running"),))
    states = [retried, done, waiting]
    loaded = Loaded(
        states,
        {r.id: _latest(r) for r in states},
        {r.id: _histories(r) for r in states},
        {failed.id: ON_ERROR},
    )
    # the failed job is resubmitted at once; the finished run is written; the running one needs nothing
    assert decide_pass(loaded, now=11.0) == [
        RunDecision(retried, resubmit=(0,)),
        RunDecision(
            done,
            values={
                "last_processed_at": 11.0,
                "fleet_id": None,
                "status": "done",
                "termination_reason": "all_jobs_done",
                "status_message": None,
            },
        ),
    ]
    # past its retry.duration, the failed run fails; one whose other job still runs stops it, terminating
    late = decide_pass(loaded, now=100.0)[0]
    assert not late.stop_jobs and late.values is not None
    assert (late.values["status"], late.values["termination_reason"]) == ("failed", "retry_limit_exceeded")
    pair = RunState("pair", "running", None, None, (failed, _job(1, "running")))
    loaded = Loaded([pair], {pair.id: _latest(pair)}, {pair.id: _histories(pair)}, {failed.id: ON_ERROR})
    (late,) = decide_pass(loaded, now=100.0)
    assert late.stop_jobs and late.values is not None
    assert (late.values["status"], late.values["termination_reason"]) == ("terminating", "retry_limit_exceeded")


def test_a_run_is_retried_whole_when_no_other_replica_is_left_running() -> None:
    """dstack 0.22.5 sends a run back to ``pending`` (and counts it in ``dstack_pending_runs_total``) only when
    none of its replicas is left; a replica retried while another serves is not."""
    one = {(0, 0): _job(0, "failed", "container_exited_with_error")}
    assert retried_whole(one, [0])
    assert not retried_whole(one, [])  # nothing resubmitted yet (its other jobs were asked to stop first)
    two = {**one, (1, 0): _job(0, "running", replica=1)}
    assert not retried_whole(two, [0])
    assert retried_whole({**one, (1, 0): _job(0, "failed", "container_exited_with_error", replica=1)}, [0, 1])
    assert retried_whole({**one, (1, 0): _job(0, "terminated", "scaled_down", replica=1)}, [0])


def test_master_done_ends_the_run_unless_a_failure_does_first() -> None:
    def run(master_done: bool, status: str = "running") -> RunState:
        return RunState("r", status, None, None, (), stop_on_master_done=master_done)

    latest = {(0, 0): _job(0, "done"), (0, 1): _job(1, "running")}
    values, stop = settle(run(True), latest, RunTerminationReason.JOB_FAILED, 5.0)
    assert values is not None and (values["status"], values["termination_reason"]) == ("terminating", "all_jobs_done")
    assert stop == "master_done"
    # all-done: the worker still runs, so does the run
    assert settle(run(False), latest, RunTerminationReason.JOB_FAILED, 5.0) == (None, None)
    # a worker that failed fails the run first (dstack checks failures before master-done)
    failed = {**latest, (0, 1): _job(1, "failed", "container_exited_with_error")}
    values, stop = settle(run(True), failed, RunTerminationReason.JOB_FAILED, 5.0)
    assert values is not None and (values["status"], values["termination_reason"]) == ("failed", "job_failed")
    assert stop is None
    # once terminating, the run waits for its jobs to end, then is done
    assert settle(run(True, "terminating"), latest, RunTerminationReason.JOB_FAILED, 5.0) == (None, None)


def test_a_preempted_dev_environment_is_not_requeued_whatever_its_retry() -> None:
    preempted = dataclasses.replace(_job(0, "failed", "interrupted_by_no_capacity"), preempted=True)
    latest = {(0, 0): preempted}
    histories = {(0, 0): [Submission(0.0, 10.0, True)]}
    on_interruption = {"on_events": ["interruption"], "duration": 3600}
    # a task's is always requeued, whatever its retry
    assert plan_retry(latest, histories, {preempted.id: None}, 20.0).resubmit == (0,)
    # a dev environment's ends the run (job_failed), even with a retry that covers interruptions
    for retry in (None, on_interruption):
        assert plan_retry(latest, histories, {preempted.id: retry}, 20.0, interactive={preempted.id}) == RetryPlan()
