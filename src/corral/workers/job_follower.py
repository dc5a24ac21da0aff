"""The job followers of :class:`corral.workers.jobs.Jobs`: one task per running job that long-polls its agent for
output, state and resource samples, stores the output in the database (every replica can serve it), sends the
stops asked for, and finishes the job when the agent says it ended. A job its submission just started comes with
its first poll already sent (:class:`Started`), so a short job's end is on its way back while its start is
recorded.

:class:`JobFollowing` is a base of ``Jobs``, which sets ``ctx``, ``_followers``, ``_pokes``, ``_stopping`` and
``_secret_values`` and provides ``_client``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from corral.agent.protocol import JobState, LogsReply
from corral.backends.agent_client import LOGS_LIMIT, AgentClient, AgentError, AgentUnreachable
from corral.context import Context
from corral.domain import inactivity
from corral.domain.documents import run_configuration
from corral.domain.log_masking import LogMasker
from corral.domain.records import InstanceRec, JobRec
from corral.domain.statuses import ACTIVE_JOB
from corral.store import metrics as metrics_store
from corral.store import runs as run_store
from corral.store.preemption import PREEMPTED
from corral.store.run_secrets import opened_auth
from corral.workers import job_metrics, job_secrets, job_utilization
from corral.workers.job_leases import JobLeases
from corral.workers.job_outcomes import JobOutcomes, Tail
from corral.workers.job_poll import logs_unless_poked, poll_unless_poked

log = logging.getLogger("corral.jobs")
_SOURCES = {"stdout": 0, "stderr": 1}


@dataclasses.dataclass(frozen=True)
class Started:
    """A job its submission just moved on (as written), and the follower's first poll, sent already."""

    current: JobRec
    poll: asyncio.Future[LogsReply]


def known_state(status: str) -> str | None:
    """The agent's state of a job the server records as ``status``, when a change from it ends a long poll (an
    image pulled); None: only new output or the job's end do."""
    return "pending" if status == "pulling" else None


class JobFollowing(JobLeases, JobOutcomes):
    ctx: Context
    _followers: dict[str, asyncio.Task[None]]
    _pokes: dict[str, asyncio.Event]
    _stopping: bool
    _secret_values: dict[str, tuple[str, ...]]
    _client: Callable[[InstanceRec], AgentClient]

    def _follow(
        self, job: JobRec, inst: InstanceRec, conf: dict[str, Any] | None = None, started: Started | None = None
    ) -> None:
        """Follow the job (``conf``: its run's configuration, if the caller has it at hand; ``started``: the job
        its submission just recorded, with the first poll already sent); none is started once the server stops
        (the next server follows it)."""
        if self._stopping:
            if started is not None:
                started.poll.cancel()
            return
        self._pokes[job.id] = asyncio.Event()
        task = asyncio.create_task(self._follower(job, inst, conf, started))
        self._followers[job.id] = task
        task.add_done_callback(self._done_following(job.id))

    def _done_following(self, job_id: str) -> Callable[[asyncio.Task[None]], None]:
        def done(_task: asyncio.Task[None]) -> None:
            self._followers.pop(job_id, None)
            self._pokes.pop(job_id, None)
            self._secret_values.pop(job_id, None)

        return done

    async def _values_to_mask(self, job: JobRec) -> tuple[str, ...]:
        given = self._secret_values.get(job.id)
        if given is not None:
            return given
        spec = job.job_spec
        auth = opened_auth(self.ctx.cipher, spec.get("registry_auth"))
        return await job_secrets.mask_values(self.ctx, job.project_id, spec.get("env") or {}, auth)

    async def _inactivity_duration(self, job: JobRec) -> int | None:
        async with self.ctx.db.read() as conn:
            run = await run_store.get_run_by_id(conn, job.run_id)
        return inactivity.duration_of(dict(run_configuration(run.run_spec))) if run is not None else None

    async def _inactive(self, job: JobRec, limit: int) -> bool:
        """A dev environment idle past its ``inactivity_duration`` is stopped as dstack stops it."""
        now = time.time()
        if not inactivity.exceeded(job.ssh_seen_at, limit, now):
            return False
        message = inactivity.message(inactivity.inactive_secs(job.ssh_seen_at or now, now), limit)
        async with self.ctx.db.write() as conn:
            ok = await run_store.update_job(
                conn,
                job.id,
                {"stop_requested": "inactivity", "termination_reason_message": message},
                expect_status=("running",),
            )
        return ok

    async def _follower(
        self, job: JobRec, inst: InstanceRec, conf: dict[str, Any] | None = None, started: Started | None = None
    ) -> None:
        try:
            token = await self._claim(job.id)
            if token is None:
                return
            try:
                await self._follow_with_lease(job, inst, token, conf, started)
            finally:
                await self._release(job.id)
        finally:
            if started is not None:
                started.poll.cancel()  # when the follower ended before it read its first poll

    async def _follow_with_lease(
        self,
        job: JobRec,
        inst: InstanceRec,
        token: str,
        conf: dict[str, Any] | None = None,
        started: Started | None = None,
    ) -> None:
        client = self._client(inst)
        offset = job.log_offset
        stop_sent: str | None = None
        poke = self._pokes.get(job.id)
        idle_limit = inactivity.duration_of(conf) if conf is not None else await self._inactivity_duration(job)
        policy, next_check = job_utilization.policy_of(job), 0.0  # utilization_policy
        if started is not None:
            metrics_after = 0  # a job just started has no samples stored
        else:
            async with self.ctx.db.read() as conn:
                metrics_after = await metrics_store.last_timestamp(conn, job.id)  # samples continue from here
        try:
            # the job's secret values never reach the stored output (``domain/log_masking.py``)
            masker = LogMasker(await self._values_to_mask(job))
            while True:
                wait = self.ctx.settings.agent_poll_wait
                if self._stopping:
                    return  # the server stops: the lease is released, another replica takes the job on
                if poke is not None:
                    poke.clear()  # whatever poked us is seen by the reload below
                # the job as its submission just wrote it (a stop requested meanwhile pokes the first poll), else as
                # stored now
                current = started.current if started is not None else await self._reload(job.id)
                if current is None or current.status not in ACTIVE_JOB:
                    return
                if not await self._keep(job.id):
                    return  # another replica took the job over
                if idle_limit is not None and current.status == "running" and not current.stop_requested:
                    if await self._inactive(current, idle_limit):
                        continue
                    seen = current.ssh_seen_at or time.time()
                    wait = max(0.5, min(wait, seen + idle_limit - time.time() + 0.1))
                if policy is not None and current.status == "running" and not current.stop_requested:
                    now = time.time()
                    if now >= next_check:
                        next_check = now + job_utilization.CHECK_EVERY_S
                        if await job_utilization.stop_if_underused(self.ctx, current, policy, now):
                            continue
                    wait = max(0.5, min(wait, next_check - now))
                if current.stop_requested and stop_sent != current.stop_requested:
                    try:
                        if current.stop_requested == PREEMPTED:  # SIGTERM and a deadline it can read
                            grace = self.ctx.preemption.grace_period
                            await client.stop(
                                job.id, deadline=time.time() + grace, message=current.termination_reason_message
                            )
                        else:
                            await client.stop(job.id, abort=current.stop_requested == "abort")
                        stop_sent = current.stop_requested
                    except (AgentUnreachable, AgentError) as e:
                        log.warning("stopping %s: %s", job.job_name, e)
                try:
                    if started is not None:
                        first, started = started.poll, None
                        reply = await poll_unless_poked(first, poke)
                    else:
                        reply = await logs_unless_poked(
                            client,
                            job.id,
                            offset,
                            0 if current.stop_requested and not stop_sent else wait,
                            poke,
                            known_state(current.status),
                            metrics_after,
                        )
                    if reply is None:
                        continue
                except AgentUnreachable:
                    if await self._unreachable(current):
                        return
                    await asyncio.sleep(1.0)
                    continue
                except AgentError as e:
                    await self._finish(
                        current,
                        JobState(job.id, "failed", message=f"agent error: {e}"),
                        stopped=None,
                        executor_error=True,
                    )
                    return
                points = job_metrics.points_of(reply, job.job_name)
                if reply.state.finished and len(reply.entries) < LOGS_LIMIT:
                    # the reply holds all the output left (the agent read it after the job ended): its tail,
                    # the job's end and the lease's release in one transaction, with no poll after it
                    if reply.state.working_dir and (current.job_runtime_data or {}).get("working_dir") != (
                        reply.state.working_dir
                    ):
                        await self._runtime(current, reply.state)
                    fed = masker.feed([(e.timestamp, _SOURCES.get(e.source, 0), e.message) for e in reply.entries])
                    tail = Tail(token, fed + masker.flush(), reply.next_offset, points, metrics_after)
                    kept = await self._finish(current, reply.state, stopped=current.stop_requested, tail=tail)
                    self._drop_lease(job.id)
                    if kept:
                        if tail.entries:
                            self.ctx.wakeups.wake_local("logs")
                        with contextlib.suppress(AgentUnreachable, AgentError):
                            await client.forget(job.id)
                    return
                if reply.entries or current.disconnected_at is not None:
                    entries = masker.feed([(e.timestamp, _SOURCES.get(e.source, 0), e.message) for e in reply.entries])
                    async with self.ctx.db.write() as conn:
                        kept = await run_store.append_logs_guarded(conn, job.id, token, entries, reply.next_offset)
                        if kept:
                            metrics_after = await job_metrics.store(conn, job.id, points, metrics_after)
                    if not kept:
                        self._drop_lease(job.id)
                        return
                    if entries:
                        self.ctx.wakeups.wake_local("logs")  # pages following this job's log tail (ui/live.py)
                    offset = reply.next_offset
                elif points:
                    async with self.ctx.db.write() as conn:
                        metrics_after = await job_metrics.store(conn, job.id, points, metrics_after)
                if current.status == "pulling" and not reply.state.finished:
                    await self._pulling(current, reply.state)
                elif reply.state.working_dir and (current.job_runtime_data or {}).get("working_dir") != (
                    reply.state.working_dir
                ):
                    await self._runtime(current, reply.state)
                if current.stop_requested and stop_sent is None:
                    await asyncio.sleep(0.5)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("follower of %s failed", job.job_name)
