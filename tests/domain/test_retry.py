"""dstack's retry rules for jobs that ran, and corral's bounded retry window (``corral.domain.retry``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from corral.domain.retry import (
    MAX_BACKOFF,
    Submission,
    Verdict,
    needs_retry_evaluation,
    resubmit_at,
    retry_duration,
    retry_event,
    retry_window_start,
    verdict,
)

ON_ERROR = {"on_events": ["error"], "duration": 60}


def test_events_follow_dstack() -> None:
    assert retry_event("failed_to_start_due_to_no_capacity") == "no-capacity"
    assert retry_event("interrupted_by_no_capacity") == "interruption"
    assert retry_event("instance_unreachable") == "error"
    assert retry_event("container_exited_with_error") == "error"
    assert retry_event("terminated_by_user") is None
    assert retry_event("done_by_runner") is None
    assert retry_event("max_duration_exceeded") is None
    assert retry_event("not-a-reason") is None and retry_event(None) is None


def test_which_jobs_are_evaluated() -> None:
    assert needs_retry_evaluation("failed", "instance_unreachable")
    assert needs_retry_evaluation("terminated", "max_duration_exceeded")
    assert not needs_retry_evaluation("terminated", "terminated_by_user")
    assert not needs_retry_evaluation("done", "done_by_runner")
    assert not needs_retry_evaluation("running", None)


def test_verdicts() -> None:
    ran = [Submission(0.0, 100.0, provisioned=True)]
    assert verdict("instance_unreachable", ON_ERROR, ran, now=101.0) == Verdict.RESUBMIT
    assert verdict("instance_unreachable", ON_ERROR, ran, now=161.0) == Verdict.LIMIT_EXCEEDED
    assert verdict("instance_unreachable", None, ran, now=101.0) == Verdict.FAIL
    assert verdict("instance_unreachable", {"on_events": ["interruption"]}, ran, now=101.0) == Verdict.FAIL
    assert verdict("interrupted_by_no_capacity", {"on_events": ["interruption"]}, ran, now=101.0) == Verdict.RESUBMIT
    # never placed: nothing to retry (the queue did the waiting)
    assert verdict("container_exited_with_error", ON_ERROR, [Submission(0.0, 1.0, False)], 2.0) == Verdict.FAIL
    # no-capacity is the queue's business, never a resubmission
    no_cap = {"on_events": ["no-capacity", "error"], "duration": 60}
    assert verdict("failed_to_start_due_to_no_capacity", no_cap, ran, now=101.0) == Verdict.FAIL
    # without a duration: dstack's default, one hour
    assert verdict("instance_unreachable", {"on_events": ["error"]}, ran, now=100.0 + 3599) == Verdict.RESUBMIT


def test_a_long_job_failing_late_is_retried_but_a_crash_loop_stops() -> None:
    long_then_fail = [Submission(0.0, 10_000.0, True), Submission(10_000.0, 20_000.0, True)]
    assert retry_window_start(long_then_fail, 60) == 20_000.0
    crash_loop = [Submission(t, t + 1, True) for t in range(0, 100, 2)]
    assert retry_window_start(crash_loop, 60) == 1.0
    assert verdict("container_exited_with_error", ON_ERROR, crash_loop, now=99.5) == Verdict.LIMIT_EXCEEDED


def _chronological(steps: list[tuple[float, float, bool]]) -> list[Submission]:
    """Each submission after the previous one ended: (wait before it, its run time, placed?)."""
    out, t = [], 0.0
    for wait, run_time, placed in steps:
        start = t + wait
        t = start + run_time  # the next one starts from this very float (no second rounding)
        out.append(Submission(start, t, placed))
    return out


submissions = st.lists(st.tuples(st.floats(0, 1e4), st.floats(0, 1e4), st.booleans()), min_size=1, max_size=12).map(
    _chronological
)


@given(submissions, st.floats(1, 1e4))
def test_window_opens_at_a_failure_of_the_history(history: list[Submission], duration: float) -> None:
    start = retry_window_start(history, duration)
    if not any(s.provisioned for s in history):
        assert start is None
        return
    assert start in {s.finished_at for s in history}
    assert start is not None and history[-1].finished_at is not None and start <= history[-1].finished_at


@given(st.integers(1, 200), st.floats(0.1, 9.9), st.floats(10, 1000))
def test_quick_failures_are_retried_for_at_most_the_duration(n: int, run_time: float, duration: float) -> None:
    """However many times a job fails quickly, resubmission stops once ``duration`` has passed since the
    first failure: a crash loop is bounded."""
    history, t = [], 0.0
    for _ in range(n):
        history.append(Submission(t, t + run_time, True))
        t += run_time
    first_failure = history[0].finished_at
    assert first_failure is not None
    retry = {"on_events": ["error"], "duration": duration}
    late = first_failure + duration + 1
    assert verdict("container_exited_with_error", retry, history, now=max(late, t)) == Verdict.LIMIT_EXCEEDED


def test_backoff_after_the_first_failure_of_a_streak() -> None:
    one = [Submission(0.0, 10.0, True)]
    assert resubmit_at(one, 60) == 10.0  # a lost host: go elsewhere at once
    quick = [Submission(t, t + 1, True) for t in range(0, 8, 2)]  # four quick failures
    assert resubmit_at(quick, 60) == 7.0 + 4.0  # then 1, 2, 4 … seconds
    many = [Submission(t, t + 1, True) for t in range(0, 200, 2)]
    assert resubmit_at(many, 3600) == 199.0 + MAX_BACKOFF
    # a long run resets the streak: the next failure is the first of a new one
    reset = [*quick, Submission(8.0, 8.0 + 500, True)]
    assert resubmit_at(reset, 60) == 508.0
    assert retry_duration({"on_events": ["error"]}) == 3600.0 and retry_duration({"duration": 5}) == 5.0


@given(submissions, st.floats(1, 1e4))
def test_a_resubmission_never_starts_before_the_failure_nor_waits_past_the_cap(
    history: list[Submission], duration: float
) -> None:
    last = history[-1].finished_at
    assert last is not None
    due = resubmit_at(history, duration)
    if any(s.provisioned for s in history):
        assert last <= due <= last + MAX_BACKOFF


def test_a_submission_that_never_finished_ends_the_streak() -> None:
    history = [
        Submission(0.0, 5.0, provisioned=True),
        Submission(6.0, None, provisioned=True),
        Submission(20.0, 25.0, provisioned=True),
    ]
    assert retry_window_start(history, 3600.0) == 25.0


def test_no_history_or_no_placement_means_resubmitting_at_once() -> None:
    assert resubmit_at([], 3600.0) == 0.0
    assert resubmit_at([Submission(0.0, 5.0, provisioned=False)], 3600.0) == 0.0
