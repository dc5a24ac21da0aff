"""What the SSH endpoint (:mod:`corral.sshd`) asks of the database: which job a connection names, the
keys that may open it, where its agent answers, and its stored output (for ``/logs_ws``).

The keys are dstack's: the run's ``ssh_key_pub``, the run's owner's current key and registered
``users/public_keys``, and the project's key. Nobody else's -- not another member's, not another
project's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from corral.backends.base import AgentEndpoint
from corral.context import Context
from corral.domain.records import JobRec, LogRec, RunRec
from corral.domain.statuses import ACTIVE_JOB
from corral.store import accounts as account_store
from corral.store import fleets as fleet_store
from corral.store import public_keys as key_store
from corral.store import runs as run_store
from corral.store import ssh_sessions as ssh_session_store

#: How long after its job ended a job's endpoint still answers (for ``/logs_ws`` to its close), as
#: dstack's runner waits for its log consumers.
GRACE_S = 300.0
ACTIVE = ACTIVE_JOB


@dataclass(frozen=True)
class JobAccess:
    job: JobRec
    run: RunRec
    keys: tuple[str, ...]
    #: The agent's URL and token (None: the job has no agent now).
    agent_url: str | None
    agent_token: str | None
    #: The user the job's sessions log in as (``job_runtime_data.username``).
    username: str

    @property
    def running(self) -> bool:
        return self.job.status == "running"

    def reachable(self, now: float) -> bool:
        """Whether the endpoint admits a connection for this job now (:func:`admits`)."""
        return admits(self.job.status, self.job.termination_reason, self.job.finished_at, now)


def admits(status: str, termination_reason: str | None, finished_at: float | None, now: float) -> bool:
    """Whether the endpoint admits a connection for a job now: running, or ended within the grace period
    and not stopped by its user."""
    if status in ACTIVE:
        return True
    if termination_reason in ("terminated_by_user", "aborted_by_user"):
        return False
    return finished_at is not None and now - finished_at < GRACE_S


async def job_access(ctx: Context, job_id: str) -> JobAccess | None:
    """The job ``job_id`` (an outer login's user name) and who may open it, or None if there is none."""
    async with ctx.db.read() as conn:
        job = await run_store.get_job(conn, job_id)
        if job is None:
            return None
        run = await run_store.get_run_by_id(conn, job.run_id)
        if run is None or run.deleted:
            return None
        user = await account_store.get_user(conn, run.user_name)
        project = await account_store.get_project(conn, run.project_name)
        extra = await key_store.list_keys(conn, user.id) if user is not None else []
        inst = await fleet_store.get_instance(conn, job.instance_id) if job.instance_id else None
    keys = [str(run.run_spec.get("ssh_key_pub") or "")]
    if user is not None:
        keys.append(user.ssh_public_key or "")
        keys += [k.key for k in extra]
    if project is not None:
        keys.append(project.ssh_public_key or "")
    url = token = None
    if inst is not None and inst.agent and job.status in ACTIVE:
        url = ctx.agent_url(inst)
        token = ctx.reveal(AgentEndpoint.from_json(inst.agent).token)
    username = str((job.job_runtime_data or {}).get("username") or "root")
    return JobAccess(job, run, tuple(k.strip() for k in keys if k and k.strip()), url, token, username)


async def read_logs(ctx: Context, job_id: str, after_id: int | None, start_time: float | None) -> list[LogRec]:
    async with ctx.db.read() as conn:
        return await run_store.read_logs(conn, job_id, after_id, 1000, start_time=start_time)


async def record_seen(ctx: Context, job_ids: Sequence[str], now: float) -> None:
    """Connections that count are open (or just closed) on these jobs: their inactivity starts again from
    ``now`` (one statement for all of them)."""
    async with ctx.db.write() as conn:
        await ssh_session_store.mark_seen(conn, job_ids, now)


async def admitted(ctx: Context, job_ids: Sequence[str], now: float) -> dict[str, bool]:
    """For each of ``job_ids``: whether its connections may stay open now, and whether it is running (one
    query for all): ``{job_id: running}`` for the admitted ones."""
    async with ctx.db.read() as conn:
        found = await ssh_session_store.reachability(conn, job_ids)
    return {
        job_id: r.status == "running"
        for job_id, r in found.items()
        if admits(r.status, r.termination_reason, r.finished_at, now)
    }


async def job_status(ctx: Context, job_id: str) -> JobRec | None:
    async with ctx.db.read() as conn:
        return await run_store.get_job(conn, job_id)
