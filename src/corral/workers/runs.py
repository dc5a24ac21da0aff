"""The runs worker: a run's status follows its jobs (``run_status_from_jobs``); a finished or stopped
run gets its final status and termination reason."""

from __future__ import annotations

import time

from corral.domain.statuses import JobStatus, RunStatus, RunTerminationReason, run_status_from_jobs
from corral.store import runs as run_store
from corral.workers.context import Context


def decide_run(status: str, termination_reason: str | None, jobs: list[str]) -> tuple[str, str | None] | None:
    """The run's next (status, termination_reason), or None if nothing changes. Pure."""
    job_statuses = [JobStatus(j) for j in jobs]
    if not job_statuses:
        return None
    if all(j.is_finished() for j in job_statuses):
        if termination_reason is not None:
            reason = RunTerminationReason(termination_reason)
        elif any(j in (JobStatus.FAILED,) for j in job_statuses):
            reason = RunTerminationReason.JOB_FAILED
        elif all(j == JobStatus.DONE for j in job_statuses):
            reason = RunTerminationReason.ALL_JOBS_DONE
        elif any(j == JobStatus.ABORTED for j in job_statuses):
            reason = RunTerminationReason.ABORTED_BY_USER
        else:
            reason = RunTerminationReason.STOPPED_BY_USER
        return reason.to_status().value, reason.value
    if status == RunStatus.TERMINATING.value:
        return None
    if any(j == JobStatus.FAILED for j in job_statuses):
        return RunStatus.TERMINATING.value, RunTerminationReason.JOB_FAILED.value
    new = run_status_from_jobs(job_statuses)
    if new is None or new.value == status:
        return None
    return new.value, termination_reason


class Runs:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    async def pass_once(self) -> None:
        async with self.ctx.db.read() as conn:
            states = await run_store.active_run_states(conn)
        now = time.time()
        for run in states:
            latest: dict[tuple[int, int], run_store.JobState] = {}
            for j in sorted(run.jobs, key=lambda j: j.submission_num):
                latest[(j.replica_num, j.job_num)] = j
            decision = decide_run(run.status, run.termination_reason, [j.status for j in latest.values()])
            master = latest.get((0, 0))
            fleet_id = run.fleet_id or (master.instance_fleet_id if master else None)
            if decision is None and fleet_id == run.fleet_id:
                continue
            values: dict[str, object] = {"last_processed_at": now, "fleet_id": fleet_id}
            if decision is not None:
                status, reason = decision
                values.update(status=status, termination_reason=reason)
                if status in ("terminating",) and reason == RunTerminationReason.JOB_FAILED.value:
                    await self._stop_jobs(run.id, "stop")
                if status in ("failed", "done", "terminated"):
                    failed = next((j for j in latest.values() if j.status == "failed"), None)
                    values["status_message"] = failed.status_message if failed else None
            async with self.ctx.db.write() as conn:
                await run_store.update_run(conn, run.id, values, expect_status=(run.status,))

    async def _stop_jobs(self, run_id: str, how: str) -> None:
        async with self.ctx.db.write() as conn:
            for job in await run_store.list_jobs(
                conn, ("submitted", "provisioning", "pulling", "running"), run_id=run_id
            ):
                await run_store.update_job(conn, job.id, {"stop_requested": how})
        self.ctx.wakeups.wake("jobs")
