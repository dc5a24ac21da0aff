"""A run of one job settled in the transaction that changes its job, by the runs worker's own decision.

The jobs worker's start and end of a job (:mod:`corral.workers.jobs.outcomes`, :mod:`corral.workers.jobs.submission`)
call :func:`settle_with_job` in their transaction: the run's row (locked where it is free: ``run_states.lock_run``)
and its jobs are read there, :func:`corral.workers.runs.decide_one` decides on them as a pass of the runs worker
would, and the run's values go through the choke point (``store/runs.update_run``), so the run's event follows the
job's and the run counts move in the same transaction. The run goes ``provisioning`` with its job's placement (the
commit point calls :func:`settle_placed` in its transaction), ``running`` with its job's start and ends with its
job's end, without a pass. A run this declines (:func:`decide_alone`: more than one job, a service, a schedule, a
stop, a preemption, a retry to make, timers to arm) is the runs worker's, woken for it as before; the runs worker
stays the authority for everything else and its safety-net passes still cover every run.

May import: corral.domain, corral.store, corral.workers.runs (its pure decision and what it reads) and
corral.workers.service_health.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.domain.statuses import ACTIVE_RUN, FINISHED_RUN
from corral.store import run_states
from corral.store import runs as run_store
from corral.store.db import Connection
from corral.workers.runs import Loaded, decide_one, load, log_finished
from corral.workers.service_health import is_service


def settles_alone(run: run_states.RunState) -> bool:
    """Whether the transaction that changes a job of ``run`` may settle the run's status itself, with
    :func:`decide_one` (the runs worker's own decision): a run of one job (every submission of one replica's one
    job), neither scheduled nor a service, not stopping, and no job of it preempted or retired. Any other run is
    the runs worker's: multi-job runs, services, scheduled runs, stops, preemptions. Pure."""
    if run.status not in ACTIVE_RUN or run.schedule or is_service(run.jobs):
        return False
    if len({(j.replica_num, j.job_num) for j in run.jobs}) != 1:
        return False
    return not any(j.preempted or j.retired for j in run.jobs)


def decide_alone(loaded: Loaded, now: float) -> tuple[bool, dict[str, object] | None]:
    """For the one run of ``loaded`` (read in the transaction that changed its job): whether that transaction
    settles it (False: the runs worker must decide, e.g. a retry to make or timers to arm), and the values it
    writes then (None: its status stays). :func:`decide_one` decides, as for the runs worker's pass. Pure."""
    (run,) = loaded.states
    if not settles_alone(run):
        return False, None
    d = decide_one(run, loaded.latest[run.id], loaded.histories.get(run.id), loaded.retries, now, loaded.interactive)
    if d is None:
        return True, None
    if d.wake_at or d.resubmit or d.stop_jobs is not None or d.give_up or d.values is None:
        return False, None
    return True, d.values


@dataclass(frozen=True)
class Settled:
    """What the transaction that changed a job did of its run's status (:func:`settle_with_job`)."""

    #: The run is settled (its status written, or it stays): the runs worker need not be woken for it.
    done: bool
    #: The run's name and the values written when it finished (logged once the transaction commits).
    finished: tuple[str, dict[str, object]] | None = None

    def log(self) -> None:
        """Log the run's end, as the runs worker logs it (call once the transaction committed)."""
        if self.finished is not None:
            log_finished(*self.finished)


async def settle_with_job(conn: Connection, locked: run_states.LockedRun, now: float) -> Settled:
    """In the transaction that has just changed a job of ``locked``'s run (its row locked since:
    ``run_states.lock_run``), settle the run as the runs worker would, from its jobs as this transaction sees them
    (:func:`decide_alone`); a run it declines is left to the runs worker. The status is written through the
    choke point, so its event follows the job's and the run counts move in the same transaction."""
    state = await run_states.with_jobs(conn, locked)
    ok, values = decide_alone(await load(conn, [state]), now)
    if not ok or values is None:
        return Settled(ok)
    if not await run_store.update_run(conn, state.id, values, expect_status=(state.status,)):
        return Settled(False)
    if values.get("status") in FINISHED_RUN:
        return Settled(True, (state.name or state.id, values))
    return Settled(True)


async def settle_placed(conn: Connection, run_id: str, now: float) -> bool:
    """The commit point's :class:`~corral.store.plan_result.RunSettler`: in its transaction, which has just placed
    the one job of run ``run_id``, settle the run as the runs worker would (:func:`settle_with_job`); whether it did
    (False: another transaction holds the run's row, or the runs worker must decide)."""
    locked = await run_states.lock_run(conn, run_id)
    if locked is None:
        return False
    return (await settle_with_job(conn, locked, now)).done
