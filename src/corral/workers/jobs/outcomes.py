"""How a job's end, and what comes before it, is recorded: its start (what the agent answered its submission), the
pull's progress, an agent that stopped answering (``instance_unreachable`` past ``agent_unreachable_timeout``),
and the job's end, mapped to dstack's statuses and termination reasons (its instance released for the next job).
A job whose last reply holds its whole remaining output ends in one transaction: the output's tail, its resource
samples, its end and the release of this replica's lease (:class:`Tail`).

What is recorded is decided by pure functions (:func:`started_values`, :func:`end_of`); :class:`JobOutcomes` is
the component the jobs driver holds that writes it, and wakes what a job's end concerns. A job's change settles its
run's status in the same transaction where the runs worker's own decision allows it (a run of one job, no retry to
make: :func:`corral.workers.run_settle.settle_with_job`); the runs worker is woken for the run only where it declines.

May import: corral.domain, corral.schemas.wire, corral.scheduler.fleet_view (the backends' names on the wire),
corral.store, corral.context, corral.workers.job_metrics, corral.workers.run_settle (its run settled in a job's
transaction) and the container side of this package (:mod:`corral.workers.jobs.container`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from corral.agent.protocol import JobState, JobSubmission
from corral.context import Context, WakeUp
from corral.domain.costs import placed_price
from corral.domain.durations import ENDS_WITH_ITS_JOB
from corral.domain.metrics import MetricsPoint
from corral.domain.records import InstanceRec, JobRec
from corral.domain.statuses import ACTIVE_JOB, HOLDING_JOB
from corral.scheduler.fleet_view import WIRE_NAMES
from corral.schemas import wire
from corral.store import fleets as fleet_store
from corral.store import leases, run_states
from corral.store import runs as run_store
from corral.store.db import Connection
from corral.store.fleets import dump
from corral.store.tables import jobs as jobs_table
from corral.workers import job_metrics
from corral.workers.jobs.container import runtime_data, with_agent_state
from corral.workers.run_settle import Settled, settle_with_job

#: A run its job's transaction did not settle: the runs worker is woken for it.
UNSETTLED = Settled(False)


@dataclass(frozen=True)
class Tail:
    """The rest of a finished job's output (the agent's last reply held all of it), stored with its end."""

    #: This replica's lease on the job: the output is stored only while it holds, and it is released after.
    token: str
    entries: Sequence[tuple[float, int, bytes]]
    next_offset: int
    points: Sequence[MetricsPoint] = ()
    metrics_after: int = 0


@dataclass(frozen=True)
class End:
    """A job's end as dstack records it."""

    status: str
    reason: str
    message: str | None


#: Backends whose instances never have network volumes attached (EBS volumes attach to aws instances only).
_NO_NETWORK_VOLUMES = frozenset({"local", "ssh", "remote", "slurm"})

#: The stops the server asks for (``jobs.stop_requested``) and how the job ends: status, reason, and whether the
#: message is the one recorded with the stop request (else the fixed one given here, or the agent's).
_STOPS: dict[str, tuple[str, str, str | None, bool]] = {
    "abort": ("aborted", "aborted_by_user", None, False),
    # its replica is submitted again (workers/runs.py)
    "resubmit": ("terminated", "terminated_by_server", "Run is to be resubmitted", False),
    # another job of its run failed for good (workers/runs.py)
    "server": ("terminated", "terminated_by_server", "Stopped: another job of the run failed", False),
    # the master job of a `stop_criteria: master-done` run is done (workers/runs.py); dstack 0.22.5 ends the
    # others as its run's reason says: all_jobs_done -> done_by_runner
    "master_done": ("done", "done_by_runner", "Stopped: the master job is done (stop_criteria: master-done)", False),
    # a service replica drained and stopped (workers/service_scaling.py)
    "scaled_down": ("terminated", "scaled_down", "scaled down", False),
    # a dev environment idle past its inactivity_duration (workers/jobs/follower.py)
    "inactivity": ("terminated", "inactivity_duration_exceeded", None, True),
    # another run took its place (workers/scheduling_preemption.py)
    "preempted": ("failed", "interrupted_by_no_capacity", None, True),
    # its GPUs stayed under its utilization_policy (workers/jobs/utilization.py)
    "utilization": ("terminated", "terminated_due_to_utilization_policy", None, True),
}


def after_end(job: JobRec) -> tuple[WakeUp, ...]:
    """The workers a job's end wakes besides the runs worker (for its run, :meth:`JobOutcomes.ended`): the
    scheduler (the capacity it freed), the instances worker where the instance ends with its job (Slurm), and
    the volumes worker (to detach the volumes it had) unless its instance cannot have any -- a drain of short
    jobs on local or SSH hosts would otherwise run a volumes pass per job for nothing."""
    backend = (job.job_provisioning_data or {}).get("corral_backend")
    # an instance that ends with its job (a Slurm allocation, idle_duration 0) is retired by the next instances pass
    ends: tuple[WakeUp, ...] = ("instances",) if backend in ENDS_WITH_ITS_JOB else ()
    if backend in _NO_NETWORK_VOLUMES:
        return ("scheduler", *ends)
    return ("scheduler", "volumes", *ends)


def end_of(job: JobRec, state: JobState, stopped: str | None, executor_error: bool = False) -> End:
    """How ``job`` ends, from the agent's last ``state`` and the stop the server asked for (``stopped``)."""
    if stopped:
        status, reason, fixed, recorded = _STOPS.get(stopped, ("terminated", "terminated_by_user", None, False))
        message = job.termination_reason_message if recorded else fixed if fixed is not None else state.message
        return End(status, reason, message)
    exit_status, message = state.exit_status, state.message
    if state.termination_reason == "terminated_by_server":  # e.g. a secret it needs is gone
        return End("terminated", "terminated_by_server", message)
    if state.state == "done" and (exit_status or 0) == 0:
        return End("done", "done_by_runner", message)
    if state.termination_reason == "max_duration_exceeded":
        return End("terminated", "max_duration_exceeded", message)
    if state.termination_reason == "ports_binding_failed":
        return End("failed", "ports_binding_failed", message)
    if state.termination_reason == "setup_failed":
        # The repo or `files` could not be set up (dstack's runner reports this the same way).
        return End("failed", "container_exited_with_error", message)
    if state.state == "failed" and exit_status is None:
        # The agent could not start the job at all (no container runtime for `image`, agent restart).
        reason = "executor_error" if executor_error or state.termination_reason else "creating_container_error"
        return End("failed", reason, message)
    if message is None and exit_status is not None:
        message = f"The job exited with code {exit_status}"
    return End("failed", "container_exited_with_error", message)


def sandbox_message(state: JobState) -> str | None:
    """The job's status message when its agent runs it without a sandbox (saying why)."""
    return state.sandbox.message if state.sandbox is not None else None


def _cloud_place(inst: InstanceRec) -> dict[str, Any] | None:
    """Where a cloud launched the instance (``{"instance_id", "region", ...}``, recorded with its agent when it
    was provisioned: :mod:`corral.backends.aws.session`); None for local and SSH hosts."""
    place = ((inst.agent or {}).get("connection") or {}).get(inst.backend)
    return place if isinstance(place, dict) and place.get("instance_id") else None


def provisioning_data(inst: InstanceRec, job_id: str, ssh: tuple[str, int] | None) -> dict[str, Any]:
    """dstack's ``job_provisioning_data``: the SSH fields in its ``dockerized`` layout, where ``hostname``
    and ``ssh_port`` are the server's SSH endpoint and ``username`` names the job (:mod:`corral.sshd`);
    ``internal_ip`` is the instance's own address. Where the job runs is said as dstack says it: a cloud
    instance by its backend (``aws``), its region and zone and the cloud's own id (``instance_id``, e.g. EC2's
    ``i-...``); local and SSH hosts as ``remote``, by corral's id of the instance. The price is the instance's
    ($/hour; 0 on local and SSH hosts). corral's own names ride in ``corral_*`` fields."""
    place = _cloud_place(inst)
    return {
        "backend": WIRE_NAMES.get(inst.backend, inst.backend),
        "corral_backend": inst.backend,
        "corral_instance": inst.name,
        "corral_instance_id": inst.id,
        "instance_type": wire.instance_type(inst.offer),
        "instance_id": str(place["instance_id"]) if place is not None else inst.id,
        "hostname": ssh[0] if ssh is not None else inst.hostname or "127.0.0.1",
        "internal_ip": inst.hostname or "127.0.0.1",
        "region": inst.region or "local",
        "availability_zone": str((inst.offer or {}).get("zone") or "") or None,
        "price": placed_price(inst.backend, inst.price),
        "username": job_id,
        "ssh_port": ssh[1] if ssh is not None else None,
        "dockerized": True,
        "ssh_proxy": None,
        "backend_data": None,
    }


def started_status(sub: JobSubmission, state: JobState) -> str:
    """The status of a job its agent just took: ``pulling`` while its image is pulled."""
    return "pulling" if state.state == "pending" and sub.image else "running"


def started_values(
    job: JobRec, inst: InstanceRec, sub: JobSubmission, state: JobState, ssh: tuple[str, int] | None, now: float
) -> dict[str, Any]:
    """What is recorded of a job its agent just took (``state``: the agent's answer)."""
    return {
        "status": started_status(sub, state),
        "last_processed_at": now,
        "ssh_seen_at": now,  # a dev environment's inactivity runs from its start
        "job_provisioning_data": provisioning_data(inst, job.id, ssh),
        "job_runtime_data": with_agent_state(runtime_data(sub, job.job_spec.get("working_dir")), state),
        "status_message": sandbox_message(state),
    }


class JobOutcomes:
    """Writes what the agent reports of a job, and its end, for the jobs driver's submissions and followers."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def ended(self, job: JobRec, settled: Settled = UNSETTLED) -> None:
        """Wake what a job's end concerns: its run's status (:meth:`run_changed`), the capacity it freed and its
        volumes (:func:`after_end`)."""
        self.run_changed(job, settled)
        self.ctx.wakeups.wake(*after_end(job))

    def run_changed(self, job: JobRec, settled: Settled) -> None:
        """After the transaction that changed ``job`` committed: log its run's end where that transaction settled
        it, else wake this process's runs pass for that run."""
        if settled.done:
            settled.log()
        else:
            self.ctx.wakeups.wake_for("runs", (job.run_id,))

    async def settle_run(self, conn: Connection, job: JobRec, changed: bool) -> Settled:
        """In the transaction that has changed ``job`` (``changed``: its update matched), settle its run's status
        where the runs worker's decision allows it (:func:`~corral.workers.run_settle.settle_with_job`); a run whose row
        another transaction holds is left to the runs worker (``run_states.lock_run`` says why)."""
        if not changed:
            return UNSETTLED
        locked = await run_states.lock_run(conn, job.run_id)
        if locked is None:
            return UNSETTLED
        return await settle_with_job(conn, locked, time.time())

    async def reload(self, job_id: str) -> JobRec | None:
        async with self.ctx.db.read() as conn:
            return await run_store.get_job(conn, job_id)

    async def pulling(self, job: JobRec, state: JobState) -> None:
        """A job whose agent is pulling its image or starting its container: record the pull's progress,
        and move the job to ``running`` (with its container's ports) once the container runs."""
        data = with_agent_state(job.job_runtime_data, state)
        values: dict[str, Any] = {"job_runtime_data": dump(data)}
        if state.state == "running":
            values.update(status="running", last_processed_at=time.time(), ssh_seen_at=time.time())
        elif data == job.job_runtime_data:
            return
        running = state.state == "running"
        async with self.ctx.db.write() as conn:
            ok = await run_store.update_job(conn, job.id, values, expect_status=("pulling",))
            settled = await self.settle_run(conn, job, ok and running)
        if ok and running:
            self.run_changed(job, settled)

    async def runtime(self, job: JobRec, state: JobState) -> None:
        """Record what the agent reports of a running job (its working dir once it started)."""
        async with self.ctx.db.write() as conn:
            await run_store.update_job(
                conn, job.id, {"job_runtime_data": dump(with_agent_state(job.job_runtime_data, state))}
            )

    async def unreachable(self, job: JobRec) -> bool:
        """Record that the job's agent did not answer; True once that lasted past ``agent_unreachable_timeout``
        (the job failed ``instance_unreachable``)."""
        now = time.time()
        if job.disconnected_at is None:
            async with self.ctx.db.write() as conn:
                await run_store.update_job(conn, job.id, {"disconnected_at": now})
            return False
        if now - job.disconnected_at < self.ctx.settings.agent_unreachable_timeout:
            return False
        values = {
            "status": "failed",
            "termination_reason": "instance_unreachable",
            "termination_reason_message": "The instance's agent stopped answering",
            "finished_at": now,
            "last_processed_at": now,
        }
        async with self.ctx.db.write() as conn:
            if job.instance_id:  # the instance's row before the job's: see :meth:`finish`
                await fleet_store.lock_instance(conn, job.instance_id)
            ok = await run_store.update_job(conn, job.id, values, expect_status=ACTIVE_JOB)
            if job.instance_id:
                await fleet_store.release_instance(conn, job.instance_id, now)
            settled = await self.settle_run(conn, job, ok)
        self.ended(job, settled)
        return True

    async def finish(
        self,
        job: JobRec,
        state: JobState,
        stopped: str | None,
        executor_error: bool = False,
        tail: Tail | None = None,
    ) -> bool:
        """Record the job's end (with ``tail``, its last output, and the lease released, in the same transaction);
        False if ``tail``'s lease no longer held (another replica drives the job: nothing is written)."""
        now = time.time()
        end = end_of(job, state, stopped, executor_error)
        values: dict[str, Any] = {
            "status": end.status,
            "termination_reason": end.reason,
            "termination_reason_message": end.message,
            # a preempted job says which run took its place (``runs/get``, ``corral ps``)
            "status_message": end.message if stopped == "preempted" else None,
            "exit_status": state.exit_status,
            "finished_at": now,
            "last_processed_at": now,
        }
        if tail is not None:  # the lease (held: the tail's write below checks it) goes with the end
            values.update(lock_owner=None, lock_token=None, lock_expires_at=None)
        async with self.ctx.db.write() as conn:
            if job.instance_id:
                # the instance's row first, as the commit point takes it: a second write of the job's row below
                # has Postgres check its keys, share-locking the instance's row, and two ends on one host that
                # each held that and asked for the row to release it deadlocked
                await fleet_store.lock_instance(conn, job.instance_id)
            if tail is not None:
                if not await run_store.append_logs_guarded(conn, job.id, tail.token, tail.entries, tail.next_offset):
                    return False
                await job_metrics.store(conn, job.id, list(tail.points), tail.metrics_after)
            ok = await run_store.update_job(conn, job.id, values, expect_status=HOLDING_JOB)
            if ok and job.instance_id:
                await fleet_store.release_instance(conn, job.instance_id, now)
            if tail is not None and not ok:
                await leases.release(conn, jobs_table, job.id, tail.token)
            settled = await self.settle_run(conn, job, ok)
        self.ended(job, settled)
        return True
