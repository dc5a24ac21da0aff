"""A placed job's submission to its agent: what it carries, built whole by the pure :func:`build_submission`
from the job, its run, its replica's nodes (:class:`Nodes`) and what was gathered for it (:class:`Given`: its
secrets filled in, its network volumes attached, its code), and the act step that gathers those, hands the
submission to the agent and records the start (:class:`Submissions`, held by the jobs driver).

The submission's nodes and their environment are :mod:`corral.workers.jobs.nodes`'s, its container side
:mod:`corral.workers.jobs.container`'s, its code :mod:`corral.workers.jobs.code`'s, its network volumes
:mod:`corral.workers.jobs.volumes`'s and its secrets :mod:`corral.workers.jobs.secrets`'s; what is recorded of the
start :mod:`corral.workers.jobs.outcomes`'s. A job started here is handed to its follower with its first poll sent
already (:class:`corral.workers.jobs.follower.Started`).

May import: corral.domain, corral.schemas.wire, corral.store, corral.context, corral.settings, the agent client and
protocol, and this package's nodes, container, code, volumes, secrets, ports, utilization, leases, outcomes and
follower.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from corral.agent.protocol import JobState, JobSubmission, LogsReply, NetworkMount
from corral.backends.agent_client import AgentClient, AgentError, AgentUnreachable
from corral.backends.base import sandbox_reason
from corral.context import Context
from corral.domain import inactivity
from corral.domain.documents import spec_configuration
from corral.domain.interpolation import InterpolationError
from corral.domain.node_groups import addresses_view, fill_refs
from corral.domain.records import InstanceRec, JobRec, RunRec
from corral.domain.startup_order import job_waits_for
from corral.settings import Settings
from corral.store import fleets as fleet_store
from corral.store import runs as run_store
from corral.store.fleets import dump
from corral.store.run_secrets import opened_auth
from corral.workers.jobs import secrets, utilization, volumes
from corral.workers.jobs.code import JobCode, JobCodeError, job_code, push_blobs
from corral.workers.jobs.container import apply_container
from corral.workers.jobs.follower import Followers, Started, known_state
from corral.workers.jobs.leases import JobLeases
from corral.workers.jobs.nodes import Nodes, job_env, nodes_of
from corral.workers.jobs.outcomes import JobOutcomes, started_status, started_values
from corral.workers.jobs.ports import ports_message, taken_ports

log = logging.getLogger("corral.jobs")
SERVER = "terminated_by_server"

# -- the pure build ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Given:
    """What a job is given besides its specs, gathered before its submission is built."""

    #: Its ``env`` with its ``${{ secrets.NAME }}`` filled in (in memory only).
    env: Mapping[str, Any]
    #: Its ``registry_auth`` in clear, secrets filled in.
    registry_auth: Any = None
    #: The values of the secrets it was given (what its output is masked for).
    secret_values: tuple[str, ...] = ()
    network_volumes: tuple[NetworkMount, ...] = ()
    code: JobCode = dataclasses.field(default_factory=lambda: JobCode(repo=None))
    #: Why its code cannot be given (the job fails ``setup_failed``), once the checks before it passed.
    code_error: str | None = None


def build_submission(job: JobRec, run: RunRec, nodes: Nodes, settings: Settings, given: Given) -> JobSubmission:
    """The job's submission to its agent, whole."""
    spec = job.job_spec
    conf = dict(spec_configuration(run.run_spec))
    if conf.get("registry_auth"):
        conf["registry_auth"] = given.registry_auth
    # ${{ groups[i].nodes[j].IP_ADDRESS }} in the commands: the nodes' addresses by group
    view = addresses_view(
        (int(j.job_spec.get("node_group_index") or 0), int(j.job_spec.get("node_group_job_index") or 0), ip)
        for j, ip in zip(nodes.jobs, nodes.ips, strict=True)
    )
    stop, most = spec.get("stop_duration"), spec.get("max_duration")
    sub = JobSubmission(
        job_id=job.id,
        run_name=job.run_name,
        commands=[fill_refs(c, view) for c in spec.get("commands") or []],
        shell=conf.get("shell"),
        env=job_env(job, run, nodes.inst, nodes.master_ip, list(nodes.ips), given.env, list(nodes.gpus)),
        working_dir=conf.get("working_dir"),  # as written: a relative one is relative to the repo dir
        image=conf.get("image"),
        user=None,
        stop_duration=float(stop) if isinstance(stop, (int, float)) and stop >= 0 else settings.default_stop_duration,
        max_duration=float(most) if isinstance(most, (int, float)) else None,
        repo=given.code.repo,
        file_archives=list(given.code.file_archives),
        home_dir=str(spec.get("home_dir") or "/root"),
        network_volumes=list(given.network_volumes),
        host_network=len(nodes.jobs) > 1 and not nodes.one_host,
    )
    apply_container(sub, job, conf, nodes.inst, settings.default_image, nodes=len(nodes.jobs))
    return sub


def ports_taken(conf: dict[str, Any], sub: JobSubmission, sandboxed: bool) -> list[int]:
    """The job's ``ports`` already held on this machine, when it would listen on them itself (a host
    process without a sandbox, or a container on the host's network; a sandboxed process listens in its own
    network namespace and a bridged container's ports are published elsewhere)."""
    if sub.image:
        if not (sub.container is not None and sub.container.network_mode == "host"):
            return []
    elif sandboxed:
        return []
    ports = [int(p["container_port"]) for p in conf.get("ports") or [] if isinstance(p, dict)]
    return taken_ports(ports) if ports else []  # a service's own `port` may be shared by its replicas


# -- the act step -----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Retry:
    """The job cannot be handed over yet: the jobs worker is woken again in ``delay`` seconds."""

    delay: float


@dataclasses.dataclass(frozen=True)
class Fail:
    """The job ends before its agent runs it."""

    state: JobState
    executor_error: bool = False


class Submissions:
    """The submissions in flight: each placed job this replica holds the lease of is handed to its agent by one
    task, which records the start and hands the job to its follower."""

    def __init__(
        self,
        ctx: Context,
        leases: JobLeases,
        outcomes: JobOutcomes,
        followers: Followers,
        client: Callable[[InstanceRec], AgentClient],
    ) -> None:
        self.ctx = ctx
        self.leases = leases
        self.outcomes = outcomes
        self.followers = followers
        self.client = client
        self._submitting: set[str] = set()
        #: Jobs asked to stop while their submission was in flight: their follower reads them afresh at once.
        self._stopped_in_flight: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def in_flight(self, job_id: str) -> bool:
        return job_id in self._submitting

    def in_flight_ids(self) -> frozenset[str]:
        return frozenset(self._submitting)

    def stop_requested(self, job_id: str) -> None:
        """A stop was asked for while the job's submission is in flight: its agent may be starting it now, so the
        submission records the start, then its follower sends the stop."""
        self._stopped_in_flight.add(job_id)

    def start(self, job: JobRec, inst: InstanceRec, run: RunRec | None) -> None:
        """Hand the job to its agent in a task of its own (the caller holds its lease)."""
        self._submitting.add(job.id)
        task = asyncio.create_task(self.submit_once(job, inst, run))
        self._tasks.add(task)
        task.add_done_callback(self._done(job.id))

    def _done(self, job_id: str) -> Callable[[asyncio.Task[None]], None]:
        def done(task: asyncio.Task[None]) -> None:
            self._submitting.discard(job_id)
            self._stopped_in_flight.discard(job_id)
            self._tasks.discard(task)

        return done

    async def wait(self, grace: float) -> None:
        """Wait for the submissions in flight (one still busy after ``grace`` seconds is cancelled)."""
        tasks = list(self._tasks)
        if tasks:
            _done, busy = await asyncio.wait(tasks, timeout=grace)
            for task in busy:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def submit_once(self, job: JobRec, inst: InstanceRec, run: RunRec | None = None) -> None:
        try:
            await self.submit(job, inst, run)
        finally:
            if not self.followers.following(job.id):
                await self.leases.release(job.id)

    async def submit(self, job: JobRec, inst: InstanceRec, run: RunRec | None = None) -> None:
        """Start the job on its agent (``run``: its run, as the pass read it, else read here)."""
        if await self.leases.claim(job.id) is None:
            return
        if run is None:
            async with self.ctx.db.read() as conn:
                run = await run_store.get_run_by_id(conn, job.run_id)
        if run is None:
            return
        nodes = await self._nodes(job, inst, run)
        if not nodes.ready:
            return await self._settle(job, Retry(0.5))  # a node's address is not known yet
        if job_waits_for(job, run) is not None:
            return await self._settle(job, Retry(0.5))  # its run's startup_order starts another node first
        given = await self._given(job, inst, run)
        if not isinstance(given, Given):
            return await self._settle(job, given)
        sub = build_submission(job, run, nodes, self.ctx.settings, given)
        conf = dict(spec_configuration(run.run_spec))
        if inst.backend == "local" and (taken := ports_taken(conf, sub, self._local_sandboxed())):
            failed = JobState(job.id, "failed", message=ports_message(taken), termination_reason="ports_binding_failed")
            return await self._settle(job, Fail(failed))
        if given.code_error is not None:
            failed = JobState(job.id, "failed", message=given.code_error, termination_reason="setup_failed")
            return await self._settle(job, Fail(failed))
        client = self.client(inst)
        state = await self._hand_over(job, inst, client, sub, given)
        if state is not None:
            await self._record_start(job, inst, run, client, sub, state)

    async def _settle(self, job: JobRec, outcome: Retry | Fail) -> None:
        if isinstance(outcome, Retry):
            asyncio.get_running_loop().call_later(outcome.delay, self.ctx.wakeups.wake_local, "jobs")
        else:
            await self.outcomes.finish(job, outcome.state, None, executor_error=outcome.executor_error)

    async def _nodes(self, job: JobRec, inst: InstanceRec, run: RunRec) -> Nodes:
        """The nodes of the job's replica; on one host, with their sandboxes' addresses once every node's instance
        is ready."""
        sib_ids = {
            j.instance_id
            for j in run.jobs
            if j.submission_num == job.submission_num and j.replica_num == job.replica_num and j.instance_id
        }
        if sib_ids == {inst.id}:  # a single node's instance is the one the pass read
            insts = [inst]
        else:
            async with self.ctx.db.read() as conn:
                insts = await fleet_store.list_instances_by_ids(conn, list(sib_ids))
        nodes = nodes_of(job, inst, run, insts)
        if nodes.one_host and nodes.ready:
            ips = await self._sandbox_addresses(nodes.jobs, {i.id: i for i in insts}, nodes.ips)
            nodes = dataclasses.replace(nodes, ips=ips)
        return nodes

    async def _sandbox_addresses(
        self, ordered: tuple[JobRec, ...], insts: dict[str, InstanceRec], fallback: tuple[str, ...]
    ) -> tuple[str, ...]:
        """Each node's address in its sandbox, reserved on its agent (idempotent: every node's submission
        asks for all of them and gets the same); a node whose agent has no sandbox keeps ``fallback``."""
        out = list(fallback)
        for k, sib in enumerate(ordered):
            inst = insts.get(sib.instance_id or "")
            if inst is None or not inst.agent:
                continue
            try:
                address = await self.client(inst).reserve_address(sib.id)
            except (AgentUnreachable, AgentError) as e:
                log.warning("no sandbox address for %s: %s", sib.job_name, e)
                continue
            if address:
                out[k] = address
        return tuple(out)

    async def _given(self, job: JobRec, inst: InstanceRec, run: RunRec) -> Given | Retry | Fail:
        """The job's secrets filled in, its network volumes attached and its code, or why it cannot have them."""
        conf = dict(spec_configuration(run.run_spec))
        auth = opened_auth(self.ctx.cipher, conf["registry_auth"]) if conf.get("registry_auth") else None
        try:  # ${{ secrets.NAME }}: filled in here, in memory only (the stored specs keep the references)
            filled = await secrets.fill(self.ctx, job.project_id, job.job_spec.get("env") or {}, auth)
        except InterpolationError as e:
            message = f"Secrets interpolation error: {e}"
            return Fail(JobState(job.id, "terminated", message=message, termination_reason=SERVER))
        try:
            mounts = await volumes.attach(self.ctx, job, inst, conf)
        except volumes.NotYet:  # an earlier job's detach is not done yet
            return Retry(1.0)
        except volumes.AttachError as e:
            return Fail(JobState(job.id, "failed", message=str(e), termination_reason="volume_error"))
        given = Given(filled.env, filled.registry_auth, filled.values, tuple(mounts))
        try:
            return dataclasses.replace(given, code=await job_code(self.ctx, run, job))
        except JobCodeError as e:
            return dataclasses.replace(given, code_error=str(e))

    def _local_sandboxed(self) -> bool:
        """Whether the local backend's agents run host-process jobs in a sandbox (their own network)."""
        local = self.ctx.computes.get("local")
        return local is not None and sandbox_reason(local) is None

    async def _hand_over(
        self, job: JobRec, inst: InstanceRec, client: AgentClient, sub: JobSubmission, given: Given
    ) -> JobState | None:
        """The agent's answer to the submission (its blobs pushed first), or None: the job ended or waits."""
        try:
            await push_blobs(self.ctx, client, given.code)
            self.followers.give_secrets(job.id, given.secret_values)
            return await client.submit(sub)
        except JobCodeError as e:
            failed = JobState(job.id, "failed", message=str(e), termination_reason="setup_failed")
            await self._settle(job, Fail(failed))
        except AgentUnreachable as e:
            log.warning("agent of %s unreachable: %s", inst.name, e)
            # tried again shortly; a host lost for good fails the job as it would a running one
            if not await self.outcomes.unreachable(job):
                await self._settle(job, Retry(1.0))
        except AgentError as e:
            await self._settle(job, Fail(JobState(job.id, "failed", message=str(e)), executor_error=True))
        return None

    def _first_poll(
        self, job: JobRec, conf: dict[str, Any], client: AgentClient, status: str, state: JobState
    ) -> asyncio.Future[LogsReply] | None:
        """The follower's first long poll, sent now: a short job's end is on its way back while its start is
        recorded (a job with a shorter first wait -- inactivity, utilization -- polls from its follower)."""
        plain = inactivity.duration_of(conf) is None and utilization.policy_of(job) is None
        if not plain or state.finished:
            return None
        wait = self.ctx.settings.agent_poll_wait
        return asyncio.ensure_future(
            client.logs(job.id, job.log_offset, wait=wait, state=known_state(status), metrics_after=0)
        )

    async def _record_start(
        self, job: JobRec, inst: InstanceRec, run: RunRec, client: AgentClient, sub: JobSubmission, state: JobState
    ) -> None:
        """Record that the agent took the job, and follow it."""
        stored_conf = dict(spec_configuration(run.run_spec))
        first = self._first_poll(job, stored_conf, client, started_status(sub, state), state)
        try:  # a job is not running before its SSH endpoint accepts connections
            ssh = await self.ctx.ssh_endpoint() if self.ctx.ssh_endpoint is not None else None
            values = started_values(job, inst, sub, state, ssh, time.time())
            dumped = {k: dump(v) if k.startswith("job_") else v for k, v in values.items()}
            async with self.ctx.db.write() as conn:
                ok = await run_store.update_job(conn, job.id, dumped, expect_status=("provisioning",))
                settled = await self.outcomes.settle_run(conn, job, ok)
        except BaseException:
            if first is not None:
                first.cancel()
            raise
        if ok:
            self.outcomes.run_changed(job, settled)
            if state.finished or not self.followers.following(job.id):
                # the follower has the run's stored configuration, and the job as just written with its first poll
                # (unless a stop was asked for meanwhile: then it reads the job afresh, and sends the stop at once)
                if job.id in self._stopped_in_flight and first is not None:
                    first.cancel()
                    first = None
                started = Started(dataclasses.replace(job, **values), first) if first is not None else None
                self.followers.follow(job, inst, stored_conf, started)
                return
        if first is not None:
            first.cancel()
