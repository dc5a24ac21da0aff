"""The runs worker: a run's status follows its jobs (``run_status_from_jobs``); a finished or stopped
run gets its final status and termination reason; a replica whose job failed after it ran is submitted
again when the job's ``retry`` says so (``corral.domain.retry``). A scheduled run (``schedule``) that
ends other than by a user's stop goes back to ``pending`` for its next trigger, as in dstack 0.22.5
(``workers/triggers.py`` fires it).

The same decision (:func:`decide_one`) settles a run of one job in the transaction that changes its job
(:mod:`corral.workers.run_settle`, called by the jobs worker); a run that declines is this worker's, woken for it
as before."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from corral.context import Context
from corral.domain.cron import next_trigger
from corral.domain.retry import Submission, Verdict, needs_retry_evaluation, resubmit_at, retry_duration, verdict
from corral.domain.statuses import (
    FINISHED_JOB,
    FINISHED_RUN,
    STOPPABLE_JOB,
    JobStatus,
    JobTerminationReason,
    RunStatus,
    RunTerminationReason,
    run_status_from_jobs,
)
from corral.store import resubmit as resubmit_store
from corral.store import run_counts, run_states
from corral.store import runs as run_store
from corral.store.db import Connection
from corral.store.errors import Conflict
from corral.workers.service_health import is_service, plan_service

log = logging.getLogger("corral.runs")


def decide_run(
    status: str,
    termination_reason: str | None,
    jobs: Sequence[tuple[str, str | None]],
    failure: RunTerminationReason = RunTerminationReason.JOB_FAILED,
) -> tuple[str, str | None] | None:
    """The run's next (status, termination_reason), or None if nothing changes. Pure.

    ``jobs`` are the latest submissions' (status, termination_reason). As in dstack 0.22.5, a job that did
    not end well fails its run (``failure``: ``job_failed``, or ``retry_limit_exceeded`` when its retry ran
    out) -- a ``failed`` job, and also one ``terminated`` by a limit of its own (``max_duration_exceeded``,
    ``inactivity_duration_exceeded``, ``terminated_due_to_utilization_policy``: ``domain.retry``'s
    ``needs_retry_evaluation``), which is not a stop by the user."""
    job_statuses = [JobStatus(s) for s, _ in jobs]
    if not job_statuses:
        # a scheduled run stopped before its first trigger has no jobs to wait for
        if status == RunStatus.TERMINATING.value and termination_reason is not None:
            return RunTerminationReason(termination_reason).to_status().value, termination_reason
        return None
    failing = any(needs_retry_evaluation(s, r) for s, r in jobs)
    if all(j.is_finished() for j in job_statuses):
        if termination_reason is not None:
            reason = RunTerminationReason(termination_reason)
        elif failing:
            reason = failure
        elif all(j == JobStatus.DONE for j in job_statuses):
            reason = RunTerminationReason.ALL_JOBS_DONE
        elif any(j == JobStatus.ABORTED for j in job_statuses):
            reason = RunTerminationReason.ABORTED_BY_USER
        else:
            reason = RunTerminationReason.STOPPED_BY_USER
        return reason.to_status().value, reason.value
    if status == RunStatus.TERMINATING.value:
        return None
    if failing:
        return RunStatus.TERMINATING.value, failure.value
    new = run_status_from_jobs(job_statuses)
    if new is None or new.value == status:
        return None
    return new.value, termination_reason


def replica_verdicts(latest: list[run_states.JobState], verdicts: Mapping[str, Verdict]) -> dict[int, Verdict]:
    """Each replica's verdict from its jobs' (dstack: any job failing for good fails the replica, then any
    whose retry ran out, else it is resubmitted if any job asks for it). Pure."""
    out: dict[int, Verdict] = {}
    for j in latest:
        v = verdicts.get(j.id)
        if v is None:
            continue
        seen = out.get(j.replica_num)
        if seen is None or _RANK[v] > _RANK[seen]:
            out[j.replica_num] = v
    return out


_BACK = (RunStatus.SUBMITTED.value, RunStatus.PROVISIONING.value)
_USER_STOPS = (RunTerminationReason.STOPPED_BY_USER.value, RunTerminationReason.ABORTED_BY_USER.value)


def rescheduled(
    schedule: Sequence[str] | None, reason: str | None, now: float, fired: float | None = None
) -> float | None:
    """The next trigger of a scheduled run that has just ended for ``reason``, or None if it ends for
    good: not scheduled, stopped by a user, or no expression fires again (dstack 0.22.5's terminating
    step). Always after ``fired`` (the trigger that started it), even on a replica whose clock is behind
    the one that fired it. Pure."""
    if not schedule or reason in _USER_STOPS:
        return None
    return next_trigger(schedule, now if fired is None else max(now, fired + 1))


_RANK = {Verdict.RESUBMIT: 0, Verdict.LIMIT_EXCEEDED: 1, Verdict.FAIL: 2}

History = dict[tuple[int, int], list[Submission]]


@dataclass(frozen=True)
class RetryPlan:
    """What the run's ``retry`` makes of its failed jobs."""

    #: The reason a failed job gives the run if it is not resubmitted.
    failure: RunTerminationReason = RunTerminationReason.JOB_FAILED
    #: The replicas to submit again (none: the run follows its jobs as usual) ...
    resubmit: tuple[int, ...] = ()
    #: ... not before this time (backing off a job that keeps failing).
    due: float = 0.0


def plan_retry(
    latest: Mapping[tuple[int, int], run_states.JobState],
    histories: History,
    retries: Mapping[str, Mapping[str, object] | None],
    now: float,
    interactive: Collection[str] = (),
) -> RetryPlan:
    """Resubmit, fail for good, or fail because the retry ran out (dstack's rules, ``domain.retry``); a
    preempted job is always resubmitted, at once, whatever its ``retry``, unless it is a dev environment's
    (``interactive``: job ids): that one ends its run, whatever its ``retry``, since a dev environment started
    afresh elsewhere is not the one its user left, and its run's message names the preemptor. Pure."""
    verdicts = {
        j.id: _preempted_verdict(j, interactive)
        if j.preempted and j.status == JobStatus.FAILED.value
        else verdict(j.termination_reason, retries.get(j.id), histories.get(key, []), now)
        for key, j in latest.items()
        if needs_retry_evaluation(j.status, j.termination_reason)
    }
    by_replica = replica_verdicts(list(latest.values()), verdicts)
    if Verdict.FAIL not in by_replica.values() and Verdict.LIMIT_EXCEEDED in by_replica.values():
        return RetryPlan(failure=RunTerminationReason.RETRY_LIMIT_EXCEEDED)
    if not by_replica or set(by_replica.values()) != {Verdict.RESUBMIT}:
        return RetryPlan()
    due = max(
        (
            resubmit_at(histories.get(key, []), retry_duration(retries.get(j.id)))
            for key, j in latest.items()
            if verdicts.get(j.id) == Verdict.RESUBMIT and not j.preempted
        ),
        default=0.0,
    )
    return RetryPlan(resubmit=tuple(sorted(by_replica)), due=due)


def _preempted_verdict(job: run_states.JobState, interactive: Collection[str]) -> Verdict:
    return Verdict.FAIL if job.id in interactive else Verdict.RESUBMIT


Latest = dict[tuple[int, int], run_states.JobState]


@dataclass(frozen=True)
class Loaded:
    """What one pass reads, in one read transaction."""

    states: list[run_states.RunState]
    #: Each run's latest submission of each job, by (replica, job) number.
    latest: dict[str, Latest]
    #: Each run's job histories; only of the runs not terminating (those whose retry is evaluated).
    histories: dict[str, History]
    #: The ``retry`` of the jobs whose retry is evaluated.
    retries: Mapping[str, Mapping[str, object] | None]
    #: Of the preempted jobs of the runs not terminating, the dev environments' (not requeued: ``plan_retry``).
    interactive: frozenset[str] = frozenset()


@dataclass(frozen=True)
class RunDecision:
    """What a pass does about one run, in this order: arm its timers, resubmit replicas, stop its jobs
    (a run failing), write ``values`` (guarded by the status read), and stop its jobs after the write (a
    service giving up)."""

    run: run_states.RunState
    wake_at: tuple[float, ...] = ()
    resubmit: tuple[int, ...] = ()
    #: Stop the run's jobs, and how (``jobs.stop_requested``: ``server``, a run failing; ``master_done``).
    stop_jobs: str | None = None
    values: dict[str, object] | None = None
    give_up: bool = False


def decide_pass(loaded: Loaded, now: float) -> list[RunDecision]:
    """Each run's decision at ``now`` (the runs that need nothing are left out). Pure."""
    decisions = (
        decide_one(run, loaded.latest[run.id], loaded.histories.get(run.id), loaded.retries, now, loaded.interactive)
        for run in loaded.states
    )
    return [d for d in decisions if d is not None]


def decide_one(
    run: run_states.RunState,
    latest: Latest,
    history: History | None,
    retries: Mapping[str, Mapping[str, object] | None],
    now: float,
    interactive: Collection[str] = (),
) -> RunDecision | None:
    """One run's decision: a service's health (``plan_service``), then its retry (``plan_retry``; a
    terminating run, with no ``history``, is not retried), then its status from its jobs. Pure."""
    wakes: tuple[float, ...] = ()
    if history is not None and is_service(run.jobs):
        sp = plan_service(latest, history, run.jobs, retries, run.submitted_at, now)
        if sp.give_up:
            return RunDecision(run, values=_give_up_values(now), give_up=True)
        if sp.check_at is not None:
            wakes = (sp.check_at + 0.01,)
        if sp.resubmit:
            return _resubmission(run, wakes, sp.resubmit, sp.due, now)
    plan = plan_retry(latest, history, retries, now, interactive) if history is not None else RetryPlan()
    if plan.resubmit:
        return _resubmission(run, wakes, plan.resubmit, plan.due, now)
    values, stop = settle(run, latest, plan.failure, now)
    if values is None and not wakes:
        return None
    return RunDecision(run, wake_at=wakes, stop_jobs=stop, values=values)


def _resubmission(
    run: run_states.RunState, wakes: tuple[float, ...], replicas: tuple[int, ...], due: float, now: float
) -> RunDecision:
    """Resubmit ``replicas`` now, or wake at ``due`` to do it then."""
    if due > now:
        return RunDecision(run, wake_at=(*wakes, due))
    return RunDecision(run, wake_at=wakes, resubmit=replicas)


def settle(
    run: run_states.RunState, latest: Latest, failure: RunTerminationReason, now: float
) -> tuple[dict[str, object] | None, str | None]:
    """The run's values to write as its jobs make it (None: nothing changes), and how its jobs are to be
    stopped first (``server``: it fails; ``master_done``: its master job is done; None: not stopped). Pure."""
    service = is_service(run.jobs)
    # a service's scaled-down replicas do not count (dstack); at zero replicas it stays as it is
    jobs = [
        (j.status, j.termination_reason)
        for j in latest.values()
        if not (service and (j.termination_reason == JobTerminationReason.SCALED_DOWN.value or j.retired))
    ]
    decision = decide_run(run.status, run.termination_reason, jobs, failure)
    if service and decision is not None and run.status == "running" and decision[0] in _BACK:
        decision = None  # a service scaling up from zero (or replacing a replica) keeps running
    master_done = stops_on_master_done(run, latest, decision)
    if master_done:
        decision = RunStatus.TERMINATING.value, RunTerminationReason.ALL_JOBS_DONE.value
    master = latest.get((0, 0))
    fleet_id = run.fleet_id or (master.instance_fleet_id if master else None)
    if decision is None and fleet_id == run.fleet_id:
        return None, None
    values: dict[str, object] = {"last_processed_at": now, "fleet_id": fleet_id}
    if decision is None:
        return values, None
    status, reason = decision
    values.update(status=status, termination_reason=reason)
    if status in FINISHED_RUN:
        failed = next((j for j in latest.values() if needs_retry_evaluation(j.status, j.termination_reason)), None)
        values["status_message"] = failed.status_message if failed else None
        trigger = rescheduled(run.schedule, reason, now, run.next_triggered_at)
        if trigger is not None:
            values.update(
                status=RunStatus.PENDING.value, termination_reason=None, next_triggered_at=trigger, fleet_id=None
            )
    if master_done:
        return values, "master_done"
    return values, "server" if status == "terminating" and reason == failure.value else None


def stops_on_master_done(run: run_states.RunState, latest: Latest, decision: tuple[str, str | None] | None) -> bool:
    """Whether the run ends now because a master job (``job_num`` 0) is done while others still run: its
    ``stop_criteria`` is ``master-done`` and its jobs do not already end it (a failure comes first), as in
    dstack 0.22.5 (``_should_stop_on_master_done``: the run goes ``terminating`` with ``all_jobs_done``). Pure."""
    if not run.stop_on_master_done or run.status == RunStatus.TERMINATING.value:
        return False
    if decision is not None and (decision[0] in FINISHED_RUN or decision[0] == RunStatus.TERMINATING.value):
        return False
    return any(j.job_num == 0 and j.status == JobStatus.DONE.value for j in latest.values())


def _give_up_values(now: float) -> dict[str, object]:
    """No replica of the service was ready for its ``retry.duration``: stop it, failing."""
    return {
        "status": RunStatus.TERMINATING.value,
        "termination_reason": RunTerminationReason.RETRY_LIMIT_EXCEEDED.value,
        "status_message": "no replica became ready within the retry duration",
        "last_processed_at": now,
    }


async def load(conn: Connection, states: list[run_states.RunState]) -> Loaded:
    """What a decision on ``states`` needs besides them, read in ``conn``: each run's latest jobs and histories,
    the ``retry`` of the jobs whose retry is evaluated, and which preempted jobs are dev environments'."""
    active = [run for run in states if run.status != RunStatus.TERMINATING.value]
    latest_by_run = {run.id: _latest(run) for run in states}
    histories = {run.id: _histories(run) for run in active}
    # only the specs of failed jobs that ran are read (a job never placed is not resubmitted)
    to_evaluate = [
        j.id
        for run in active
        for key, j in latest_by_run[run.id].items()
        if is_service(run.jobs)  # a service's retry.duration is its clock (service_health)
        or (
            needs_retry_evaluation(j.status, j.termination_reason)
            and any(s.provisioned for s in histories[run.id].get(key, []))
        )
    ]
    retries = await resubmit_store.retry_specs(conn, to_evaluate)
    # a preempted dev environment is not requeued (``plan_retry``)
    preempted = [
        j.id
        for run in active
        for j in latest_by_run[run.id].values()
        if j.preempted and j.status == JobStatus.FAILED.value
    ]
    interactive = await resubmit_store.dev_environment_jobs(conn, preempted)
    return Loaded(states, latest_by_run, histories, retries, interactive)


class Runs:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._timer: asyncio.TimerHandle | None = None

    async def pass_once(self) -> None:
        # the runs whose jobs this process changed (``Wakeups.wake_for``), or None: every run that may settle
        loaded = await self._load(self.ctx.wakeups.take("runs"))
        now = time.time()
        decisions = decide_pass(loaded, now)
        await self._act(loaded, decisions, now)
        await self._apply(decisions)

    async def _load(self, scope: Collection[str] | None) -> Loaded:
        async with self.ctx.db.read() as conn:
            # a pending run waits for its trigger (workers/triggers.py), its jobs are an earlier trigger's; a run
            # only waiting in the queue changes when a job of it does: neither is read
            return await load(conn, await run_states.active_run_states(conn, settling=True, run_ids=scope))

    async def _act(self, loaded: Loaded, decisions: Sequence[RunDecision], now: float) -> None:
        """Arm the timers, resubmit the replicas and stop the failing runs' jobs, each in its own write."""
        for d in decisions:
            for when in d.wake_at:
                self._wake_at(when)
            if d.give_up:
                log.info("service %s: no replica became ready within its retry duration; stopping it", d.run.name)
            if d.resubmit:
                await self._resubmit(d.run, loaded.latest[d.run.id], d.resubmit, now)
            if d.stop_jobs is not None:
                await self._stop_jobs(d.run.id, d.stop_jobs)

    async def _apply(self, decisions: Sequence[RunDecision]) -> None:
        """Write the runs' new values, then stop the jobs of the services given up."""
        updates = [(d.run, d.values) for d in decisions if d.values is not None]
        if updates:  # one transaction for the whole pass: a burst of finished runs is one write
            finished = []
            async with self.ctx.db.write() as conn:
                for run, values in updates:
                    updated = await run_store.update_run(conn, run.id, values, expect_status=(run.status,))
                    if updated and values.get("status") in FINISHED_RUN:
                        finished.append((run, values))
                    elif updated and values.get("status") == RunStatus.PENDING.value:
                        at = values["next_triggered_at"]
                        log.info("run %s: waiting for its next trigger at %s", run.name, at)
                        self.ctx.wakeups.wake("triggers")
            for run, values in finished:
                log_finished(run.name or run.id, values)
        for d in decisions:
            if d.give_up:
                await self._stop_jobs(d.run.id, "server")

    def _wake_at(self, when: float) -> None:
        """Run a pass at ``when`` (wall clock): one timer, the earliest asked for."""
        loop = asyncio.get_running_loop()
        at = loop.time() + max(0.0, when - time.time())
        if self._timer is not None and loop.time() < self._timer.when() <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(at, self.ctx.wakeups.wake_local, "runs")

    async def _resubmit(
        self,
        run: run_states.RunState,
        latest: dict[tuple[int, int], run_states.JobState],
        replicas: tuple[int, ...],
        now: float,
    ) -> None:
        submitted = []
        try:
            async with self.ctx.db.write() as conn:
                for replica in replicas:
                    ids = [j.id for j in latest.values() if j.replica_num == replica]
                    # a preempted replica keeps its place by the run's original submission time
                    preempted = any(j.preempted for j in latest.values() if j.replica_num == replica)
                    queued_at = run.submitted_at if preempted else None
                    if await resubmit_store.resubmit_replica(conn, run.id, replica, ids, now, queued_at):
                        submitted.append(replica)
                if retried_whole(latest, submitted):
                    await run_counts.retried_whole(conn, run.id)  # dstack: the run goes back to pending
        except Conflict:
            return  # another server replica resubmitted it first
        if not submitted:  # its other jobs are asked to stop first; their end wakes this worker again
            self.ctx.wakeups.wake("jobs")
            return
        failed = [j for j in latest.values() if j.replica_num in replicas and j.status == "failed"]
        log.info(
            "run %s: resubmitting replica(s) %s after %s",
            run.id,
            submitted,
            ", ".join(sorted({j.termination_reason or j.status for j in failed})) or "a failure",
        )
        self.ctx.wakeups.wake("scheduler", "jobs", "runs")

    async def _stop_jobs(self, run_id: str, how: str) -> None:
        async with self.ctx.db.write() as conn:
            for job in await run_store.list_jobs(conn, STOPPABLE_JOB, run_id=run_id):
                await run_store.update_job(conn, job.id, {"stop_requested": how})
        self.ctx.wakeups.wake("jobs")


def retried_whole(latest: Mapping[tuple[int, int], run_states.JobState], resubmitted: Collection[int]) -> bool:
    """Whether resubmitting the replicas ``resubmitted`` retries the run whole: some were, and no other replica
    of the run still has a job that has not finished (dstack's run goes back to ``pending`` then; a replica
    resubmitted while others still run is retried alone)."""
    return bool(resubmitted) and not any(
        j.replica_num not in resubmitted and j.status not in FINISHED_JOB for j in latest.values()
    )


def log_finished(name: str, values: Mapping[str, object]) -> None:
    status, reason, message = values.get("status"), values.get("termination_reason"), values.get("status_message")
    log.info(
        "run %s finished: %s (%s)%s",
        name,
        status,
        reason,
        f": {message}" if message else "",
        extra={"event": "run_finished", "run_name": name, "status": status, "termination_reason": reason},
    )


def _latest(run: run_states.RunState) -> Latest:
    latest: Latest = {}
    for j in sorted(run.jobs, key=lambda j: j.submission_num):
        latest[(j.replica_num, j.job_num)] = j
    return latest


def _histories(run: run_states.RunState) -> History:
    """Every submission of each job of the run (by replica and job number), oldest first; of a scheduled
    run, only those of the trigger that fired it (its ``retry`` counts from there, as in dstack). A
    preemption starts the history afresh: what ran before it, and the time preempted, do not count against
    ``retry.duration``."""
    out: History = {}
    since = run.next_triggered_at if run.schedule else None
    for j in sorted(run.jobs, key=lambda j: j.submission_num):
        if since is not None and j.submitted_at < since:
            continue
        if j.preempted:
            out[(j.replica_num, j.job_num)] = []
            continue
        out.setdefault((j.replica_num, j.job_num), []).append(Submission(j.submitted_at, j.finished_at, j.provisioned))
    return out
