"""The job followers: one task per running job that long-polls its agent for output, state and resource samples,
stores the output in the database (every replica can serve it), sends the stops asked for, and finishes the job
when the agent says it ended. A job its submission just started comes with its first poll already sent
(:class:`Started`), so a short job's end is on its way back while its start is recorded.

What a follower does next is decided by the pure :func:`next_step` from the job as stored now, the time and the
job's policies (its poll wait, a dev environment's ``inactivity_duration``, a ``utilization_policy``): poll the
agent (:class:`Poll`), send it a stop (:class:`SendStop`), record that a dev environment went idle
(:class:`Idle`), or end (:class:`Finish`). :class:`Followers` is the component the jobs driver holds that starts,
pokes and stops the follower tasks; :class:`JobFollower` is one job's loop, which acts on those steps.

May import: corral.domain, corral.store, corral.context, the agent client and protocol, corral.workers.job_metrics
and this package's leases, outcomes, poll, secrets and utilization.
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
from corral.domain.documents import spec_configuration
from corral.domain.log_masking import LogMasker
from corral.domain.records import AGENT_LOG_SOURCE, InstanceRec, JobRec
from corral.domain.statuses import ACTIVE_JOB
from corral.store import metrics as metrics_store
from corral.store import runs as run_store
from corral.store.preemption import PREEMPTED
from corral.store.run_secrets import opened_auth
from corral.workers import job_metrics
from corral.workers.jobs import secrets, utilization
from corral.workers.jobs.disk_guard import PAUSED, DiskGuard, dropped_note
from corral.workers.jobs.leases import JobLeases
from corral.workers.jobs.log_limit import LogLimit
from corral.workers.jobs.outcomes import JobOutcomes, Tail
from corral.workers.jobs.poll import logs_unless_poked, poll_unless_poked

log = logging.getLogger("corral.jobs")
_SOURCES = {"stdout": 0, "stderr": 1, "agent": AGENT_LOG_SOURCE}


@dataclasses.dataclass(frozen=True)
class Started:
    """A job its submission just moved on (as written), and the follower's first poll, sent already."""

    current: JobRec
    poll: asyncio.Future[LogsReply]


def known_state(status: str) -> str | None:
    """The agent's state of a job the server records as ``status``, when a change from it ends a long poll (an
    image pulled); None: only new output or the job's end do."""
    return "pending" if status == "pulling" else None


# -- the pure decision ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Policies:
    """What a follower's steps depend on besides the job: fixed for the life of the follower."""

    #: The agent's long poll, at most (``agent_poll_wait``).
    poll_wait: float
    #: A dev environment's ``inactivity_duration`` (None: none).
    idle_limit: int | None = None
    #: The job's ``(min_gpu_utilization, time_window)`` (None: no ``utilization_policy``).
    utilization_policy: tuple[int, float] | None = None
    #: How often the utilisation is looked at.
    utilization_every: float = utilization.CHECK_EVERY_S
    #: The grace period a preempted job is given to stop.
    preemption_grace: float = 0.0


@dataclasses.dataclass(frozen=True)
class Current:
    """What the follower knows now: the job as stored (None: gone), the stop it sent last, and when the job's
    utilisation is to be looked at next."""

    job: JobRec | None
    stop_sent: str | None = None
    utilization_due: float = 0.0


@dataclasses.dataclass(frozen=True)
class Poll:
    """Long-poll the agent for ``wait`` seconds (after looking at the job's utilisation, ``check_utilization``)."""

    wait: float
    check_utilization: bool = False


@dataclasses.dataclass(frozen=True)
class SendStop:
    """Send the agent the stop the job asks for (``stop``), then poll for ``wait`` seconds -- at once if the stop
    could not be sent."""

    stop: str
    wait: float
    abort: bool = False
    #: A preempted job's deadline (SIGTERM and a deadline it can read), and the message it is given.
    deadline: float | None = None
    message: str | None = None


@dataclasses.dataclass(frozen=True)
class Idle:
    """A dev environment idle past its ``inactivity_duration``: ask it to stop, with this message."""

    message: str


@dataclasses.dataclass(frozen=True)
class Finish:
    """The job ended (or is gone): the follower ends."""


Step = Poll | SendStop | Idle | Finish


def next_step(current: Current, now: float, policies: Policies) -> Step:
    """What the follower of ``current.job`` does next, at ``now``."""
    job = current.job
    if job is None or job.status not in ACTIVE_JOB:
        return Finish()
    wait = policies.poll_wait
    if job.stop_requested:
        if current.stop_sent == job.stop_requested:
            return Poll(wait)
        if job.stop_requested == PREEMPTED:
            deadline = now + policies.preemption_grace
            return SendStop(job.stop_requested, wait, deadline=deadline, message=job.termination_reason_message)
        return SendStop(job.stop_requested, wait, abort=job.stop_requested == "abort")
    if job.status != "running":
        return Poll(wait)
    limit = policies.idle_limit
    if limit is not None:
        if inactivity.exceeded(job.ssh_seen_at, limit, now):
            return Idle(inactivity.message(inactivity.inactive_secs(job.ssh_seen_at or now, now), limit))
        seen = job.ssh_seen_at or now
        wait = max(0.5, min(wait, seen + limit - now + 0.1))
    check = False
    if policies.utilization_policy is not None:
        due = current.utilization_due
        if now >= due:
            check, due = True, now + policies.utilization_every
        wait = max(0.5, min(wait, due - now))
    return Poll(wait, check)


# -- the loop ---------------------------------------------------------------------------------------------------


class Followers:
    """The follower tasks of the jobs this replica drives, one per job."""

    def __init__(
        self, ctx: Context, leases: JobLeases, outcomes: JobOutcomes, client: Callable[[InstanceRec], AgentClient]
    ) -> None:
        self.ctx = ctx
        self.leases = leases
        self.outcomes = outcomes
        self.client = client
        #: The follower task of each job followed.
        self.tasks: dict[str, asyncio.Task[None]] = {}
        #: Set to cut a follower's long poll short (a stop to send now, not when the poll ends).
        self._pokes: dict[str, asyncio.Event] = {}
        self._stopping = False
        #: The secret values a job was just given, for its follower's masking (else read from the store).
        self._secret_values: dict[str, tuple[str, ...]] = {}

    @property
    def stopping(self) -> bool:
        return self._stopping

    def following(self, job_id: str) -> bool:
        return job_id in self.tasks

    def give_secrets(self, job_id: str, values: tuple[str, ...]) -> None:
        """The secret values ``job_id`` is given now (its follower masks them without reading them again)."""
        self._secret_values[job_id] = values

    def poke(self, job_id: str) -> bool:
        """Cut the job's long poll short (a stop to send); False if it is not followed here."""
        poke = self._pokes.get(job_id)
        if poke is None:
            return False
        poke.set()
        return True

    def follow(
        self, job: JobRec, inst: InstanceRec, conf: dict[str, Any] | None = None, started: Started | None = None
    ) -> None:
        """Follow the job (``conf``: its run's configuration, if the caller has it at hand; ``started``: the job
        its submission just recorded, with the first poll already sent); none is started once the server stops
        (the next server follows it)."""
        if self._stopping:
            if started is not None:
                started.poll.cancel()
            return
        poke = self._pokes[job.id] = asyncio.Event()
        follower = JobFollower(self, job, inst, poke, started)
        task = asyncio.create_task(follower.run(conf))
        self.tasks[job.id] = task
        task.add_done_callback(self._done(job.id))

    def _done(self, job_id: str) -> Callable[[asyncio.Task[None]], None]:
        def done(_task: asyncio.Task[None]) -> None:
            self.tasks.pop(job_id, None)
            self._pokes.pop(job_id, None)
            self._secret_values.pop(job_id, None)

        return done

    def halt(self) -> None:
        """Start no follower any more (the server stops): the next server follows the jobs."""
        self._stopping = True

    async def stop(self, grace: float) -> None:
        """Followers end at their next wait (poked now), so none is cancelled inside a write transaction; one
        still busy after ``grace`` seconds is cancelled."""
        self.halt()
        for poke in self._pokes.values():
            poke.set()
        tasks = list(self.tasks.values())
        if tasks:
            _done, busy = await asyncio.wait(tasks, timeout=grace)
            for task in busy:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def values_to_mask(self, job: JobRec) -> tuple[str, ...]:
        given = self._secret_values.get(job.id)
        if given is not None:
            return given
        spec = job.job_spec
        auth = opened_auth(self.ctx.cipher, spec.get("registry_auth"))
        return await secrets.mask_values(self.ctx, job.project_id, spec.get("env") or {}, auth)

    async def policies(self, job: JobRec, conf: dict[str, Any] | None) -> Policies:
        """The job's policies (``conf``: its run's configuration, else read here)."""
        if conf is None:
            async with self.ctx.db.read() as conn:
                run = await run_store.get_run_by_id(conn, job.run_id)
            conf = dict(spec_configuration(run.run_spec)) if run is not None else None
        return Policies(
            poll_wait=self.ctx.settings.agent_poll_wait,
            idle_limit=inactivity.duration_of(conf) if conf is not None else None,
            utilization_policy=utilization.policy_of(job),
            utilization_every=utilization.check_every(utilization.policy_of(job)),
            preemption_grace=self.ctx.preemption.grace_period,
        )


class JobFollower:
    """One job's follower: the loop that acts on :func:`next_step`, holding this replica's lease on the job."""

    def __init__(
        self, followers: Followers, job: JobRec, inst: InstanceRec, poke: asyncio.Event, started: Started | None
    ) -> None:
        self.ctx = followers.ctx
        self.followers = followers
        self.leases = followers.leases
        self.outcomes = followers.outcomes
        self.job = job
        self.inst = inst
        self.client: AgentClient  # the agent's pooled client, taken once the lease is held
        self.poke = poke
        self.started = started
        self.offset = job.log_offset
        self.known = Current(job)
        self.metrics_after = 0
        self.token = ""
        self.masker = LogMasker(())
        self.policies = Policies(poll_wait=self.ctx.settings.agent_poll_wait)
        self.disk = DiskGuard(self.ctx.settings.server_dir, self.ctx.settings.min_free_disk)
        self.log_limit = LogLimit(self.ctx.settings.job_log_limit)
        #: Who this follower is when a write of it fails for lack of space (``Context.disk_full``).
        self.who = f"the follower of {job.job_name}"

    async def run(self, conf: dict[str, Any] | None) -> None:
        try:
            token = await self.leases.claim(self.job.id)
            if token is None:
                return
            self.token = token
            try:
                await self._follow_with_lease(conf)
            finally:
                await self.leases.release(self.job.id)
        finally:
            self.ctx.disk_full.forget(self.who)  # ended: it tries nothing again
            if self.started is not None:
                self.started.poll.cancel()  # when the follower ended before it read its first poll

    async def _follow_with_lease(self, conf: dict[str, Any] | None) -> None:
        job = self.job
        self.client = self.followers.client(self.inst)
        self.policies = policies = await self.followers.policies(job, conf)
        if self.started is None:
            async with self.ctx.db.read() as conn:
                self.metrics_after = await metrics_store.last_timestamp(conn, job.id)  # samples continue from here
        try:
            # the job's secret values never reach the stored output (``domain/log_masking.py``)
            self.masker = LogMasker(await self.followers.values_to_mask(job))
            while not self.followers.stopping:  # a stopping server releases the lease: another replica follows
                # a step that failed to write for lack of space is tried again (from the job as stored then: its
                # agent still holds what was not stored) once space returns
                if not await self.ctx.until_it_fits(self.who, lambda: self._next(policies)):
                    return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("follower of %s failed", job.job_name)

    async def _next(self, policies: Policies) -> bool:
        """The job as stored now, and the next step on it; False when the follower ends."""
        job = self.job
        self.poke.clear()  # whatever poked us is seen by the reload below
        # the job as its submission just wrote it (a stop requested meanwhile pokes the first poll), else as stored now
        current = self.started.current if self.started is not None else await self.outcomes.reload(job.id)
        self.known = dataclasses.replace(self.known, job=current)
        if current is None or current.status not in ACTIVE_JOB:
            return False
        if not await self.leases.keep(job.id):
            return False  # another replica took the job over
        return await self._step(current, next_step(self.known, time.time(), policies))

    async def _step(self, current: JobRec, step: Step) -> bool:  # noqa: C901
        """Act on ``step``; False when the follower ends."""
        if isinstance(step, Finish):
            return False
        if isinstance(step, Idle):
            if not await self._idle(current, step.message):
                await asyncio.sleep(0.5)  # it left ``running`` meanwhile: the next reload sees how
            return True
        wait = step.wait
        if isinstance(step, SendStop):
            if await self._send_stop(step):
                self.known = dataclasses.replace(self.known, stop_sent=step.stop)
            wait = wait if self.known.stop_sent else 0
        elif step.check_utilization and await self._underused(current):
            return True
        try:
            reply = await self._poll(current, wait)
        except AgentUnreachable:
            if await self.outcomes.unreachable(current):
                return False
            await asyncio.sleep(1.0)
            return True
        except AgentError as e:
            failed = JobState(self.job.id, "failed", message=f"agent error: {e}")
            await self.outcomes.finish(current, failed, stopped=None, executor_error=True)
            return False
        if reply is None:
            return True  # poked
        if not await self._reply(current, reply):
            return False
        if isinstance(step, SendStop) and self.known.stop_sent is None:
            await asyncio.sleep(0.5)
        return True

    async def _underused(self, job: JobRec) -> bool:
        """Look at the job's utilisation now (and next in ``utilization_every``); whether it was asked to stop."""
        now = time.time()
        self.known = dataclasses.replace(self.known, utilization_due=now + self.policies.utilization_every)
        policy = self.policies.utilization_policy
        return policy is not None and await utilization.stop_if_underused(self.ctx, job, policy, now)

    async def _idle(self, job: JobRec, message: str) -> bool:
        """A dev environment idle past its ``inactivity_duration`` is stopped as dstack stops it."""
        async with self.ctx.db.write() as conn:
            return await run_store.update_job(
                conn,
                job.id,
                {"stop_requested": "inactivity", "termination_reason_message": message},
                expect_status=("running",),
            )

    async def _send_stop(self, step: SendStop) -> bool:
        try:
            if step.deadline is not None:
                await self.client.stop(self.job.id, deadline=step.deadline, message=step.message)
            else:
                await self.client.stop(self.job.id, abort=step.abort)
        except (AgentUnreachable, AgentError) as e:
            log.warning("stopping %s: %s", self.job.job_name, e)
            return False
        return True

    async def _poll(self, current: JobRec, wait: float) -> LogsReply | None:
        """The agent's reply to the first poll (sent by the submission) or to a long poll of ``wait`` seconds;
        None when poked meanwhile."""
        if self.started is not None:
            first, self.started = self.started.poll, None
            return await poll_unless_poked(first, self.poke)
        state = known_state(current.status)
        return await logs_unless_poked(
            self.client, self.job.id, self.offset, wait, self.poke, state, self.metrics_after
        )

    async def _reply(self, current: JobRec, reply: LogsReply) -> bool:
        """Store what the agent's reply brought; False when the follower ends."""
        points = job_metrics.points_of(reply, self.job.job_name)
        # the job ended: its end is recorded with the rest of its output, or without it while space is low
        if reply.state.finished and (len(reply.entries) < LOGS_LIMIT or self.disk.low(self.job.job_name)):
            await self._ended(current, reply, points)
            return False
        low = bool(reply.entries) and self.disk.low(self.job.job_name)
        if reply.entries and self.disk.changed:
            await self._say_paused(low)
        if low:
            await asyncio.sleep(1.0)  # the output stays on the agent, from the same offset, until space returns
        elif reply.entries or current.disconnected_at is not None:
            entries = self.masker.feed([(e.timestamp, _SOURCES.get(e.source, 0), e.message) for e in reply.entries])
            async with self.ctx.db.write() as conn:
                kept = await run_store.append_logs_guarded(conn, self.job.id, self.token, entries, reply.next_offset)
                if kept:
                    await self.log_limit.appended(conn, self.job.id, self.job.job_name, entries)
                    self.metrics_after = await job_metrics.store(conn, self.job.id, points, self.metrics_after)
            if not kept:
                self.leases.drop(self.job.id)
                return False
            if entries:
                self.ctx.wakeups.wake_local("logs")  # pages following this job's log tail (ui/live.py)
            self.offset = reply.next_offset
        elif points:
            async with self.ctx.db.write() as conn:
                self.metrics_after = await job_metrics.store(conn, self.job.id, points, self.metrics_after)
        if current.status == "pulling" and not reply.state.finished:
            await self.outcomes.pulling(current, reply.state)
        elif _new_working_dir(current, reply.state):
            await self.outcomes.runtime(current, reply.state)
        return True

    async def _say_paused(self, paused: bool) -> None:
        """The running job's status message says whether its output waits for space (a small write that fits)."""
        async with self.ctx.db.write() as conn:
            await run_store.update_job(
                conn, self.job.id, {"status_message": PAUSED if paused else None}, expect_status=("running",)
            )

    async def _ended(self, current: JobRec, reply: LogsReply, points: list[Any]) -> None:
        """The reply holds all the output left (the agent read it after the job ended): its tail, the job's end
        and the lease's release in one transaction, with no poll after it."""
        if _new_working_dir(current, reply.state):
            await self.outcomes.runtime(current, reply.state)
        fed = self.masker.feed([(e.timestamp, _SOURCES.get(e.source, 0), e.message) for e in reply.entries])
        fed += self.masker.flush()
        if fed and self.disk.low(self.job.job_name):  # the job's end is recorded all the same
            fed = [dropped_note(self.offset, time.time(), self.ctx.settings.server_dir)]
        tail = Tail(self.token, fed, reply.next_offset, points, self.metrics_after)
        kept = await self.outcomes.finish(current, reply.state, stopped=current.stop_requested, tail=tail)
        self.leases.drop(self.job.id)
        if kept:
            if tail.entries:
                self.ctx.wakeups.wake_local("logs")
            with contextlib.suppress(AgentUnreachable, AgentError):
                await self.client.forget(self.job.id)


def _new_working_dir(job: JobRec, state: JobState) -> bool:
    """Whether the agent reports a working dir the job's runtime data does not have yet."""
    return bool(state.working_dir) and (job.job_runtime_data or {}).get("working_dir") != state.working_dir
