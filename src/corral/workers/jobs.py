"""The jobs worker: hand placed jobs to their instance's agent, follow them, stop them.

Each running job has one follower task that long-polls its agent for output and state, stores the
output in the database (every replica can serve it) and finishes the job when the agent says it ended.
An agent that stays unreachable past ``agent_unreachable_timeout`` fails the job ``instance_unreachable``.
The submission's contents are :mod:`corral.workers.job_submission`'s, the replica's leases on its jobs
:mod:`corral.workers.job_leases`'s, and what is recorded from the agent :mod:`corral.workers.job_outcomes`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from corral.agent.protocol import JobState, JobSubmission
from corral.backends.agent_client import LOGS_LIMIT, AgentClient, AgentError, AgentUnreachable
from corral.backends.base import AgentEndpoint
from corral.domain import inactivity
from corral.domain.interpolation import InterpolationError
from corral.domain.log_masking import LogMasker
from corral.domain.node_groups import addresses_view, fill_refs
from corral.domain.records import InstanceRec, JobRec
from corral.store import fleets as fleet_store
from corral.store import metrics as metrics_store
from corral.store import runs as run_store
from corral.store.fleets import dump
from corral.store.preemption import PREEMPTED
from corral.store.run_secrets import opened_auth
from corral.workers import job_metrics, job_secrets, job_utilization, job_volumes
from corral.workers.context import Context
from corral.workers.job_code import JobCodeError, job_code, push_blobs
from corral.workers.job_container import apply_container, runtime_data, with_agent_state
from corral.workers.job_leases import JobLeases
from corral.workers.job_outcomes import JobOutcomes, Tail
from corral.workers.job_poll import logs_unless_poked
from corral.workers.job_ports import ports_message
from corral.workers.job_submission import job_env, job_gpus, ports_taken, provisioning_data, sandbox_message

log = logging.getLogger("corral.jobs")
SERVER = "terminated_by_server"
_SOURCES = {"stdout": 0, "stderr": 1}
#: How long a stopping server waits for its job followers to end at their next wait before cancelling them.
STOP_GRACE = 5.0


class Jobs(JobLeases, JobOutcomes):
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._followers: dict[str, asyncio.Task[None]] = {}
        #: Set to cut a follower's long poll short (a stop to send now, not when the poll ends).
        self._pokes: dict[str, asyncio.Event] = {}
        self._stopping = False
        self._submitting: set[str] = set()
        #: The submission tasks in flight (``stop_all`` waits for them before the followers they start).
        self._submits: set[asyncio.Task[None]] = set()
        self._clients: dict[tuple[str, str], AgentClient] = {}
        self._leases: dict[str, str] = {}
        self._lease_until: dict[str, float] = {}
        #: The secret values a job was just given, for its follower's masking (else read from the store).
        self._secret_values: dict[str, tuple[str, ...]] = {}

    def _client(self, inst: InstanceRec) -> AgentClient:
        """One pooled client per agent, shared by submissions and followers."""
        stored = AgentEndpoint.from_json(inst.agent or {"token": ""}).token  # sealed: opened once per client
        url = self.ctx.agent_url(inst)
        key = (url, stored)
        client = self._clients.get(key)
        if client is None:
            token = self.ctx.reveal(stored)
            client = self._clients[key] = AgentClient(url, token, timeout=self.ctx.settings.agent_request_timeout)
        return client

    async def pass_once(self) -> None:
        await self._act(*await self._load())

    async def _load(self) -> tuple[list[JobRec], dict[str, InstanceRec], set[str]]:
        """The active jobs, their instances, and which of them another replica holds."""
        async with self.ctx.db.read() as conn:
            active = await run_store.list_jobs(conn, ("provisioning", "pulling", "running"))
            inst_ids = list({j.instance_id for j in active if j.instance_id})
            insts = {i.id: i for i in await fleet_store.list_instances_by_ids(conn, inst_ids)}
            elsewhere = await run_store.leased_elsewhere(conn, [j.id for j in active], self.ctx.replica_id, time.time())
        return active, insts, set(elsewhere)

    async def _act(self, active: list[JobRec], insts: dict[str, InstanceRec], elsewhere: set[str]) -> None:
        """Start the placed jobs (what ``_load`` read may be stale by now: the claims decide), follow the
        running ones, poke those to stop."""
        starts: list[tuple[JobRec, InstanceRec]] = []
        for job in active:
            if job.id in elsewhere:
                continue  # another replica drives it; its lease expires if that replica dies
            inst = insts.get(job.instance_id or "")
            if job.status == "provisioning":
                if job.stop_requested:
                    await self._finish(job, JobState(job.id, "terminated"), stopped=job.stop_requested)
                elif (
                    inst is not None
                    and inst.status in ("idle", "busy")
                    and inst.agent
                    and job.id not in self._submitting
                ):
                    starts.append((job, inst))
            elif job.id not in self._followers and inst is not None and inst.agent:
                self._follow(job, inst)
            elif job.stop_requested and job.id in self._pokes:
                self._pokes[job.id].set()
        # the leases of every job this pass starts, in one transaction; each is submitted by one task
        held = await self._claim_many([j.id for j, _ in starts], ("provisioning",)) if starts else set()
        for job, inst in starts:
            if job.id in held and job.id not in self._submitting:
                self._submitting.add(job.id)
                task = asyncio.create_task(self._submit_once(job, inst))
                self._submits.add(task)
                task.add_done_callback(self._done_submitting(job.id))

    def _follow(self, job: JobRec, inst: InstanceRec, conf: dict[str, Any] | None = None) -> None:
        """Follow the job (``conf``: its run's configuration, if the caller has it at hand); none is started once
        the server stops (the next server follows it)."""
        if self._stopping:
            return
        self._pokes[job.id] = asyncio.Event()
        task = asyncio.create_task(self._follower(job, inst, conf))
        self._followers[job.id] = task
        task.add_done_callback(self._done_following(job.id))

    def _done_submitting(self, job_id: str) -> Callable[[asyncio.Task[None]], None]:
        def done(task: asyncio.Task[None]) -> None:
            self._submitting.discard(job_id)
            self._submits.discard(task)

        return done

    def _done_following(self, job_id: str) -> Callable[[asyncio.Task[None]], None]:
        def done(_task: asyncio.Task[None]) -> None:
            self._followers.pop(job_id, None)
            self._pokes.pop(job_id, None)
            self._secret_values.pop(job_id, None)

        return done

    async def stop_all(self) -> None:
        """Followers end at their next wait (poked now), so none is cancelled inside a write transaction
        (a cancelled statement can leave SQLite's write lock held, and every later writer waiting on it);
        one still busy after ``STOP_GRACE`` is cancelled. Submissions in flight go first: none is left to start a
        follower, or to write, once the database is closed."""
        self._stopping = True
        for tasks in (list(self._submits), None):
            if tasks is None:
                for poke in self._pokes.values():
                    poke.set()
                tasks = list(self._followers.values())
            if tasks:
                _done, busy = await asyncio.wait(tasks, timeout=STOP_GRACE)
                for task in busy:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()

    async def _submit_once(self, job: JobRec, inst: InstanceRec) -> None:
        try:
            await self._submit(job, inst)
        finally:
            if job.id not in self._followers:
                await self._release(job.id)

    async def _submit(self, job: JobRec, inst: InstanceRec) -> None:
        if await self._claim(job.id) is None:
            return
        async with self.ctx.db.read() as conn:
            run = await run_store.get_run_by_id(conn, job.run_id)
            # the nodes of this job's replica (a service's other replicas are not its nodes)
            siblings = [
                j
                for j in (run.jobs if run else ())
                if j.submission_num == job.submission_num and j.replica_num == job.replica_num
            ]
            sib_insts = await fleet_store.list_instances_by_ids(
                conn, [j.instance_id for j in siblings if j.instance_id]
            )
        if run is None:
            return
        ips = {i.id: "127.0.0.1" if i.backend == "local" else (i.hostname or "") for i in sib_insts}
        ordered = sorted(siblings, key=lambda j: j.job_num)
        nodes_ips = [ips.get(j.instance_id or "", "") for j in ordered]
        # Nodes on one host (the local backend) meet at their sandboxes' addresses; across hosts they keep
        # the hosts' network, where they reach each other.
        one_host = len(ordered) > 1 and all(i.backend == "local" for i in sib_insts)
        by_id = {i.id: i for i in sib_insts}
        ready = all(
            (x := by_id.get(j.instance_id or "")) is not None and x.agent and x.status in ("idle", "busy")
            for j in ordered
        )
        if one_host and not ready:
            # a node's instance is still starting: its address is not known yet; try again shortly
            asyncio.get_running_loop().call_later(0.5, self.ctx.wakeups.wake_local, "jobs")
            return
        if one_host:
            nodes_ips = await self._sandbox_addresses(ordered, {i.id: i for i in sib_insts}, nodes_ips)
        master_ip = nodes_ips[0] if nodes_ips else "127.0.0.1"
        # ${{ groups[i].nodes[j].IP_ADDRESS }} in the commands: the nodes' addresses by group
        view = addresses_view(
            (int(j.job_spec.get("node_group_index") or 0), int(j.job_spec.get("node_group_job_index") or 0), ip)
            for j, ip in zip(ordered, nodes_ips, strict=True)
        )
        nodes_gpus = [job_gpus(j, by_id[j.instance_id]) if j.instance_id in by_id else 0 for j in ordered]
        conf = dict(run.run_spec.get("configuration", {}))
        if conf.get("registry_auth"):
            conf["registry_auth"] = opened_auth(self.ctx.cipher, conf["registry_auth"])
        spec = job.job_spec
        try:  # ${{ secrets.NAME }}: filled in here, in memory only (the stored specs keep the references)
            filled = await job_secrets.fill(self.ctx, job.project_id, spec.get("env") or {}, conf.get("registry_auth"))
        except InterpolationError as e:
            message = f"Secrets interpolation error: {e}"
            await self._finish(job, JobState(job.id, "terminated", message=message, termination_reason=SERVER), None)
            return
        if conf.get("registry_auth"):
            conf["registry_auth"] = filled.registry_auth
        stop = spec.get("stop_duration")
        submission = JobSubmission(
            job_id=job.id,
            run_name=job.run_name,
            commands=[fill_refs(c, view) for c in spec.get("commands") or []],
            shell=conf.get("shell"),
            env=job_env(job, run, inst, master_ip, nodes_ips, filled.env, nodes_gpus),
            working_dir=conf.get("working_dir"),  # as written: a relative one is relative to the repo dir
            image=conf.get("image"),
            user=None,
            stop_duration=float(stop)
            if isinstance(stop, (int, float)) and stop >= 0
            else self.ctx.settings.default_stop_duration,
            max_duration=float(spec["max_duration"]) if isinstance(spec.get("max_duration"), (int, float)) else None,
        )
        apply_container(submission, job, conf, inst, self.ctx.settings.default_image, nodes=len(ordered))
        submission.host_network = len(ordered) > 1 and not one_host
        try:
            submission.network_volumes = await job_volumes.attach(self.ctx, job, inst, conf)
        except job_volumes.NotYet:  # an earlier job's detach is not done yet
            asyncio.get_running_loop().call_later(1.0, self.ctx.wakeups.wake_local, "jobs")
            return
        except job_volumes.AttachError as e:
            failed = JobState(job.id, "failed", message=str(e), termination_reason="volume_error")
            await self._finish(job, failed, None)
            return
        if inst.backend == "local" and (taken := ports_taken(conf, submission, self._local_sandboxed())):
            failed = JobState(job.id, "failed", message=ports_message(taken), termination_reason="ports_binding_failed")
            await self._finish(job, failed, None)
            return
        client = self._client(inst)
        try:
            code = await job_code(self.ctx, run, job)
            submission.repo, submission.file_archives = code.repo, code.file_archives
            submission.home_dir = str(spec.get("home_dir") or "/root")
            await push_blobs(self.ctx, client, code)
            self._secret_values[job.id] = filled.values
            state = await client.submit(submission)
        except JobCodeError as e:
            await self._finish(job, JobState(job.id, "failed", message=str(e), termination_reason="setup_failed"), None)
            return
        except AgentUnreachable as e:
            log.warning("agent of %s unreachable: %s", inst.name, e)
            # tried again shortly; a host lost for good fails the job as it would a running one
            if not await self._unreachable(job):
                asyncio.get_running_loop().call_later(1.0, self.ctx.wakeups.wake_local, "jobs")
            return
        except AgentError as e:
            await self._finish(job, JobState(job.id, "failed", message=str(e)), stopped=None, executor_error=True)
            return
        # a job is not running before its SSH endpoint accepts connections
        ssh = await self.ctx.ssh_endpoint() if self.ctx.ssh_endpoint is not None else None
        now = time.time()
        async with self.ctx.db.write() as conn:
            ok = await run_store.update_job(
                conn,
                job.id,
                {
                    "status": "pulling" if state.state == "pending" and submission.image else "running",
                    "last_processed_at": now,
                    "ssh_seen_at": now,  # a dev environment's inactivity runs from its start
                    "job_provisioning_data": dump(provisioning_data(inst, job.id, ssh)),
                    "job_runtime_data": dump(
                        with_agent_state(runtime_data(submission, spec.get("working_dir")), state)
                    ),
                    "status_message": sandbox_message(state),
                },
                expect_status=("provisioning",),
            )
        if ok:
            self.ctx.wakeups.wake_for("runs", (job.run_id,))
            if state.finished or job.id not in self._followers:
                # the follower reads the job as it is now before its first poll; it has the run's stored configuration
                self._follow(job, inst, dict(run.run_spec.get("configuration") or {}))

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
        return inactivity.duration_of(dict(run.run_spec.get("configuration") or {})) if run is not None else None

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

    def _local_sandboxed(self) -> bool:
        """Whether the local backend's agents run host-process jobs in a sandbox (their own network)."""
        local = self.ctx.computes.get("local")
        return local is not None and getattr(local, "sandbox_reason", None) is None

    async def _sandbox_addresses(
        self, ordered: list[JobRec], insts: dict[str, InstanceRec], fallback: list[str]
    ) -> list[str]:
        """Each node's address in its sandbox, reserved on its agent (idempotent: every node's submission
        asks for all of them and gets the same); a node whose agent has no sandbox keeps ``fallback``."""
        out = list(fallback)
        for k, sib in enumerate(ordered):
            inst = insts.get(sib.instance_id or "")
            if inst is None or not inst.agent:
                continue
            try:
                address = await self._client(inst).reserve_address(sib.id)
            except (AgentUnreachable, AgentError) as e:
                log.warning("no sandbox address for %s: %s", sib.job_name, e)
                continue
            if address:
                out[k] = address
        return out

    async def _follower(self, job: JobRec, inst: InstanceRec, conf: dict[str, Any] | None = None) -> None:
        token = await self._claim(job.id)
        if token is None:
            return
        try:
            await self._follow_with_lease(job, inst, token, conf)
        finally:
            await self._release(job.id)

    async def _follow_with_lease(
        self, job: JobRec, inst: InstanceRec, token: str, conf: dict[str, Any] | None = None
    ) -> None:
        client = self._client(inst)
        offset = job.log_offset
        stop_sent: str | None = None
        poke = self._pokes.get(job.id)
        idle_limit = inactivity.duration_of(conf) if conf is not None else await self._inactivity_duration(job)
        policy, next_check = job_utilization.policy_of(job), 0.0  # utilization_policy
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
                current = await self._reload(job.id)
                if current is None or current.status not in ("running", "pulling", "provisioning"):
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
                    reply = await logs_unless_poked(
                        client,
                        job.id,
                        offset,
                        0 if current.stop_requested and not stop_sent else wait,
                        poke,
                        "pending" if current.status == "pulling" else None,
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
