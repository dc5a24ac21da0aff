"""When a finished job is submitted again: dstack's ``retry`` rules for jobs that ran (pure).

A job that fails or is interrupted after it was placed on an instance is resubmitted (a new submission
of the same job, ``submission_num + 1``) when its ``retry.on_events`` names the event its termination
reason maps to and the current streak of failures is younger than ``retry.duration``
(``retry_window_start``); the whole replica goes again, as in dstack. A job that never got an instance
is not resubmitted here: corral's queue already waited for capacity as long as ``retry`` allowed
(docs/dev/architecture.md, queue semantics).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from corral.domain.statuses import JobStatus, JobTerminationReason

#: dstack's ``JobTerminationReason.to_retry_event`` special cases; every other reason whose job status
#: is ``failed`` is an ``error``, and the rest (stopped, done, scaled down, …) never retry.
_EVENTS = {
    JobTerminationReason.FAILED_TO_START_DUE_TO_NO_CAPACITY: "no-capacity",
    JobTerminationReason.INTERRUPTED_BY_NO_CAPACITY: "interruption",
}


def retry_event(termination_reason: str | None) -> str | None:
    """The retry event (``no-capacity``, ``interruption``, ``error``) a termination reason triggers."""
    if termination_reason is None:
        return None
    try:
        reason = JobTerminationReason(termination_reason)
    except ValueError:
        return None
    if reason in _EVENTS:
        return _EVENTS[reason]
    return "error" if reason.to_status() == JobStatus.FAILED else None


class Verdict(str, Enum):
    RESUBMIT = "resubmit"
    #: The event is one ``retry`` covers, but its duration has run out.
    LIMIT_EXCEEDED = "limit_exceeded"
    #: No retry: the run fails because of this job.
    FAIL = "fail"


def needs_retry_evaluation(status: str, termination_reason: str | None) -> bool:
    """A finished job that did not end well (dstack's ``_job_needs_retry_evaluation``). A job the server
    stopped is not judged: it was stopped because of another job of its run (a failure, or its replica
    being submitted again), which is judged instead."""
    if status == JobStatus.FAILED.value:
        return True
    return status in ("terminated", "aborted") and termination_reason not in (
        JobTerminationReason.DONE_BY_RUNNER.value,
        JobTerminationReason.SCALED_DOWN.value,
        JobTerminationReason.TERMINATED_BY_USER.value,
        JobTerminationReason.ABORTED_BY_USER.value,
        JobTerminationReason.TERMINATED_BY_SERVER.value,
    )


@dataclass(frozen=True)
class Submission:
    """What the rule needs of one submission of a job (oldest first in a history)."""

    submitted_at: float
    finished_at: float | None
    #: It was placed on an instance (dstack: it has provisioning data).
    provisioned: bool


def _streak(history: Sequence[Submission], duration: float) -> tuple[float, int] | None:
    """(when the current streak of failures began, how many failures it has) -- see ``retry_window_start``."""
    if not any(s.provisioned for s in history) or history[-1].finished_at is None:
        return None
    start, count = history[-1].finished_at, 1
    for earlier, later in zip(reversed(history[:-1]), reversed(history[1:]), strict=True):
        if earlier.finished_at is None or later.finished_at is None:
            break
        if later.finished_at - later.submitted_at > duration:
            break
        start, count = earlier.finished_at, count + 1
    return start, count


def retry_window_start(history: Sequence[Submission], duration: float) -> float | None:
    """When the current run of failures began: the retry window opens at it and lasts ``duration``.

    dstack measures the window from the latest failure alone, so a job that fails at once keeps being
    resubmitted for ever. corral follows a streak instead: walking back from the latest failure, an
    earlier failure belongs to the streak when the submission after it failed within ``duration`` too.
    A job that crash-loops stops after ``duration``; a long job failing after hours is retried, as in
    dstack. None if no submission was ever placed on an instance.
    """
    streak = _streak(history, duration)
    return None if streak is None else streak[0]


def retry_duration(retry: Mapping[str, Any] | None) -> float:
    """``retry.duration`` in seconds (dstack's default: one hour)."""
    raw = (retry or {}).get("duration")
    return float(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else 3600.0


#: The longest wait between two resubmissions of a job that keeps failing.
MAX_BACKOFF = 60.0


def resubmit_at(history: Sequence[Submission], duration: float) -> float:
    """When the next submission of a job whose latest one failed may start: at once after the first failure
    of a streak (a lost host: go elsewhere now), then 1, 2, 4 … seconds after the latest failure, up to
    ``MAX_BACKOFF`` (a crash loop does not spin through submissions as fast as it can fail)."""
    streak = _streak(history, duration)
    last = history[-1].finished_at if history else None
    if streak is None or last is None:
        return 0.0
    failures = streak[1]
    return last if failures <= 1 else last + min(MAX_BACKOFF, 2.0 ** (failures - 2))


def verdict(
    termination_reason: str | None, retry: Mapping[str, Any] | None, history: Sequence[Submission], now: float
) -> Verdict:
    """What to do about a job whose latest submission (``history[-1]``) ended with ``termination_reason``.

    ``retry`` is the job spec's (``{"on_events": [...], "duration": seconds}`` or None). A ``no-capacity``
    failure is never resubmitted: the queue already waited as long as ``retry`` allowed, or the job can
    never fit.
    """
    event = retry_event(termination_reason)
    if retry is None or event is None or event == "no-capacity" or event not in (retry.get("on_events") or ()):
        return Verdict.FAIL
    duration = retry_duration(retry)
    start = retry_window_start(history, duration)
    if start is None:
        return Verdict.FAIL
    if now - start > duration:
        return Verdict.LIMIT_EXCEEDED
    return Verdict.RESUBMIT
