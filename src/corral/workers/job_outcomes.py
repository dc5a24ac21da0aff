"""What the server records from a job's agent: the pull's progress, an agent that stopped answering
(``instance_unreachable`` past ``agent_unreachable_timeout``), and the job's end, mapped to dstack's
statuses and termination reasons (its instance released for the next job). A job whose last reply holds
its whole remaining output ends in one transaction: the output's tail, its resource samples, its end and the
release of this replica's lease (:class:`Tail`).

:class:`JobOutcomes` is a base of :class:`corral.workers.jobs.Jobs`, which sets ``ctx``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from corral.agent.protocol import JobState
from corral.context import Context, WakeUp
from corral.domain.metrics import MetricsPoint
from corral.domain.records import JobRec
from corral.domain.statuses import ACTIVE_JOB, HOLDING_JOB
from corral.store import fleets as fleet_store
from corral.store import leases
from corral.store import runs as run_store
from corral.store.fleets import dump
from corral.store.tables import jobs as jobs_table
from corral.workers import job_metrics
from corral.workers.job_container import with_agent_state


@dataclass(frozen=True)
class Tail:
    """The rest of a finished job's output (the agent's last reply held all of it), stored with its end."""

    #: This replica's lease on the job: the output is stored only while it holds, and it is released after.
    token: str
    entries: Sequence[tuple[float, int, bytes]]
    next_offset: int
    points: Sequence[MetricsPoint] = ()
    metrics_after: int = 0


#: Backends whose instances never have network volumes attached (EBS volumes attach to aws instances only).
_NO_NETWORK_VOLUMES = frozenset({"local", "ssh", "remote"})


def _after_end(job: JobRec) -> tuple[WakeUp, ...]:
    """The workers a job's end wakes besides the runs worker (for its run, :meth:`JobOutcomes._ended`): the
    scheduler (the capacity it freed), and the volumes worker (to detach the volumes it had) unless its
    instance cannot have any -- a drain of short jobs on local or SSH hosts would otherwise run a volumes pass
    per job for nothing."""
    backend = (job.job_provisioning_data or {}).get("corral_backend")
    if backend in _NO_NETWORK_VOLUMES:
        return ("scheduler",)
    return ("scheduler", "volumes")


class JobOutcomes:
    ctx: Context

    def _ended(self, job: JobRec) -> None:
        """Wake what a job's end concerns: its run's status (this process's runs pass, for that run), the
        capacity it freed and its volumes (``_after_end``)."""
        self.ctx.wakeups.wake_for("runs", (job.run_id,))
        self.ctx.wakeups.wake(*_after_end(job))

    async def _reload(self, job_id: str) -> JobRec | None:
        async with self.ctx.db.read() as conn:
            return await run_store.get_job(conn, job_id)

    async def _pulling(self, job: JobRec, state: JobState) -> None:
        """A job whose agent is pulling its image or starting its container: record the pull's progress,
        and move the job to ``running`` (with its container's ports) once the container runs."""
        data = with_agent_state(job.job_runtime_data, state)
        values: dict[str, Any] = {"job_runtime_data": dump(data)}
        if state.state == "running":
            values.update(status="running", last_processed_at=time.time(), ssh_seen_at=time.time())
        elif data == job.job_runtime_data:
            return
        async with self.ctx.db.write() as conn:
            ok = await run_store.update_job(conn, job.id, values, expect_status=("pulling",))
        if ok and state.state == "running":
            self.ctx.wakeups.wake_for("runs", (job.run_id,))

    async def _runtime(self, job: JobRec, state: JobState) -> None:
        """Record what the agent reports of a running job (its working dir once it started)."""
        async with self.ctx.db.write() as conn:
            await run_store.update_job(
                conn, job.id, {"job_runtime_data": dump(with_agent_state(job.job_runtime_data, state))}
            )

    async def _unreachable(self, job: JobRec) -> bool:
        now = time.time()
        if job.disconnected_at is None:
            async with self.ctx.db.write() as conn:
                await run_store.update_job(conn, job.id, {"disconnected_at": now})
            return False
        if now - job.disconnected_at < self.ctx.settings.agent_unreachable_timeout:
            return False
        async with self.ctx.db.write() as conn:
            await run_store.update_job(
                conn,
                job.id,
                {
                    "status": "failed",
                    "termination_reason": "instance_unreachable",
                    "termination_reason_message": "The instance's agent stopped answering",
                    "finished_at": now,
                    "last_processed_at": now,
                },
                expect_status=ACTIVE_JOB,
            )
            if job.instance_id:
                await fleet_store.release_instance(conn, job.instance_id, now)
        self._ended(job)
        return True

    async def _finish(
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
        exit_status = state.exit_status
        message = state.message
        if stopped == "abort":
            status, reason = "aborted", "aborted_by_user"
        elif stopped == "resubmit":  # its replica is submitted again (workers/runs.py)
            status, reason, message = "terminated", "terminated_by_server", "Run is to be resubmitted"
        elif stopped == "server":  # another job of its run failed for good (workers/runs.py)
            status, reason, message = "terminated", "terminated_by_server", "Stopped: another job of the run failed"
        elif stopped == "scaled_down":  # a service replica drained and stopped (workers/service_scaling.py)
            status, reason, message = "terminated", "scaled_down", "scaled down"
        elif stopped == "inactivity":  # a dev environment idle past its inactivity_duration (workers/jobs.py)
            status, reason, message = "terminated", "inactivity_duration_exceeded", job.termination_reason_message
        elif stopped == "preempted":  # another run took its place (workers/scheduling_preemption.py)
            status, reason = "failed", "interrupted_by_no_capacity"
            message = job.termination_reason_message
        elif stopped == "utilization":  # its GPUs stayed under its utilization_policy (workers/job_utilization.py)
            status, reason = "terminated", "terminated_due_to_utilization_policy"
            message = job.termination_reason_message
        elif stopped:
            status, reason = "terminated", "terminated_by_user"
        elif state.termination_reason == "terminated_by_server":  # e.g. a secret it needs is gone
            status, reason = "terminated", "terminated_by_server"
        elif state.state == "done" and (exit_status or 0) == 0:
            status, reason = "done", "done_by_runner"
        elif state.termination_reason == "max_duration_exceeded":
            status, reason = "terminated", "max_duration_exceeded"
        elif state.termination_reason == "ports_binding_failed":
            status, reason = "failed", "ports_binding_failed"
        elif state.termination_reason == "setup_failed":
            # The repo or `files` could not be set up (dstack's runner reports this the same way).
            status, reason = "failed", "container_exited_with_error"
        elif state.state == "failed" and exit_status is None:
            # The agent could not start the job at all (no container runtime for `image`, agent restart).
            status = "failed"
            reason = "executor_error" if executor_error or state.termination_reason else "creating_container_error"
        else:
            status, reason = "failed", "container_exited_with_error"
            if message is None and exit_status is not None:
                message = f"The job exited with code {exit_status}"
        async with self.ctx.db.write() as conn:
            if tail is not None:
                if not await run_store.append_logs_guarded(conn, job.id, tail.token, tail.entries, tail.next_offset):
                    return False
                await job_metrics.store(conn, job.id, list(tail.points), tail.metrics_after)
            values: dict[str, Any] = {
                "status": status,
                "termination_reason": reason,
                "termination_reason_message": message,
                # a preempted job says which run took its place (``runs/get``, ``corral ps``)
                "status_message": message if stopped == "preempted" else None,
                "exit_status": exit_status,
                "finished_at": now,
                "last_processed_at": now,
            }
            if tail is not None:  # the lease (held: the tail's write above checked it) goes with the end
                values.update(lock_owner=None, lock_token=None, lock_expires_at=None)
            expect = HOLDING_JOB
            ok = await run_store.update_job(conn, job.id, values, expect_status=expect)
            if ok and job.instance_id:
                await fleet_store.release_instance(conn, job.instance_id, now)
            if tail is not None and not ok:
                await leases.release(conn, jobs_table, job.id, tail.token)
        self._ended(job)
        return True
