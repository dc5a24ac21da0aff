"""What a service's replica failures make of the run (pure; the runs worker acts on it).

dstack terminates a whole service when one replica fails without ``retry``. corral isolates replicas: a
replica that failed after it was placed -- or got no capacity while another replica was placed -- is
submitted again (``submission_num + 1``, backing off as ``domain.retry.resubmit_at``) while the others keep
serving, and the run stays ``running``. What ends a
service is that none of its replicas was ready for ``retry.duration`` (default one hour): from its
submission, or from the last moment any replica was seen ready (or, back from zero replicas, from the
first replica submitted since). It then ends ``failed`` with ``retry_limit_exceeded``. A service scaled
to zero waits for requests and stays as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from corral.domain.retry import Submission, needs_retry_evaluation, resubmit_at, retry_duration
from corral.domain.statuses import JobTerminationReason
from corral.store.run_states import JobState


@dataclass(frozen=True)
class ServicePlan:
    #: Replicas to submit again ...
    resubmit: tuple[int, ...] = ()
    #: ... not before this time.
    due: float = 0.0
    #: No replica was ready for ``retry.duration``: the run fails (``retry_limit_exceeded``).
    give_up: bool = False
    #: When to look again (the end of the clock while no replica is ready).
    check_at: float | None = None


def is_service(jobs: tuple[JobState, ...]) -> bool:
    return any(j.ready is not None for j in jobs)


def plan_service(
    latest: Mapping[tuple[int, int], JobState],
    histories: Mapping[tuple[int, int], list[Submission]],
    all_jobs: tuple[JobState, ...],
    retries: Mapping[str, Mapping[str, object] | None],
    run_submitted_at: float,
    now: float,
) -> ServicePlan:
    scaled_down = JobTerminationReason.SCALED_DOWN.value
    latest = {k: j for k, j in latest.items() if not j.retired}  # removed by the scaler: not waited for
    if all(j.termination_reason == scaled_down for j in latest.values()):
        return ServicePlan()  # at zero replicas (autoscaled): nothing is waited for
    retry = next((r for j in latest.values() if (r := retries.get(j.id)) is not None), None)
    duration = retry_duration(retry)
    since = max([run_submitted_at, *(j.ready_at for j in all_jobs if j.ready_at is not None)])
    # back from zero: the clock starts at the first replica submitted since the last one was scaled down
    downs = [j.finished_at for j in all_jobs if j.termination_reason == scaled_down and j.finished_at is not None]
    if downs:
        after = [j.submitted_at for j in all_jobs if j.submitted_at >= max(downs)]
        if after:
            since = max(since, min(after))
    ready_now = any(j.ready and j.status == "running" for j in latest.values())
    if not ready_now and now - since > duration:
        return ServicePlan(give_up=True)
    check_at = None if ready_now else since + duration
    # a replica that got no capacity while another was placed waits its turn again rather than failing the
    # service (when none was ever placed -- nothing fits -- the run fails as dstack's does)
    placed = any(s.provisioned for history in histories.values() for s in history)
    failed = [
        key
        for key, j in latest.items()
        if needs_retry_evaluation(j.status, j.termination_reason)
        and (
            j.preempted  # another run took its place (a service its project lets be preempted): it goes again
            or any(s.provisioned for s in histories.get(key, []))
            or (placed and j.termination_reason == JobTerminationReason.FAILED_TO_START_DUE_TO_NO_CAPACITY.value)
        )
    ]
    if not failed:
        return ServicePlan(check_at=check_at)
    due = max(resubmit_at(histories.get(key, []), duration) for key in failed)
    return ServicePlan(resubmit=tuple(sorted({key[0] for key in failed})), due=due, check_at=check_at)
