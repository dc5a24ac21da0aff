"""The jobs worker: hand placed jobs to their instance's agent, follow them, stop them.

A job the scheduler of this replica placed on a ready instance comes leased already (``Context.placed_leases``):
the pass it wakes reads only those jobs and starts them; any other placed job is claimed first. Each running
job has one follower task (:mod:`corral.workers.job_follower`) that long-polls its agent for output and state.
An agent that stays unreachable past ``agent_unreachable_timeout`` fails the job ``instance_unreachable``.
The submission's contents are :mod:`corral.workers.job_submission`'s, the replica's leases on its jobs
:mod:`corral.workers.job_leases`'s, and what is recorded from the agent :mod:`corral.workers.job_outcomes`'s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from corral.agent.protocol import JobState, JobSubmission
from corral.backends.agent_client import AgentClient, AgentError, AgentUnreachable
from corral.backends.base import AgentEndpoint, sandbox_reason
from corral.context import Context
from corral.domain import inactivity
from corral.domain.documents import run_configuration
from corral.domain.interpolation import InterpolationError
from corral.domain.node_groups import addresses_view, fill_refs
from corral.domain.records import InstanceRec, JobRec, RunRec
from corral.domain.statuses import ACTIVE_JOB, READY_INSTANCE
from corral.store import fleets as fleet_store
from corral.store import runs as run_store
from corral.store.fleets import dump
from corral.store.run_secrets import opened_auth
from corral.workers import job_secrets, job_utilization, job_volumes
from corral.workers.job_code import JobCodeError, job_code, push_blobs
from corral.workers.job_container import apply_container, runtime_data, with_agent_state
from corral.workers.job_follower import JobFollowing, Started, known_state
from corral.workers.job_ports import ports_message
from corral.workers.job_submission import job_env, job_gpus, ports_taken, provisioning_data, sandbox_message

log = logging.getLogger("corral.jobs")
SERVER = "terminated_by_server"
#: How long a stopping server waits for its job followers to end at their next wait before cancelling them.
STOP_GRACE = 5.0


class Jobs(JobFollowing):
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._followers: dict[str, asyncio.Task[None]] = {}
        #: Set to cut a follower's long poll short (a stop to send now, not when the poll ends).
        self._pokes: dict[str, asyncio.Event] = {}
        self._stopping = False
        self._submitting: set[str] = set()
        #: Jobs asked to stop while their submission was in flight: their follower reads them afresh at once.
        self._stopped_in_flight: set[str] = set()
        #: Jobs whose lease the scheduler's commit took for this replica, not yet handed to a submission task.
        self._adopted: set[str] = set()
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
        """A pass over every active job, or -- woken only for the jobs this replica's scheduler just placed and
        leased (``Context.placed_leases``) -- over those."""
        scope = self.ctx.wakeups.take("jobs")
        self._adopt()
        await self._act(*await self._load(scope))

    def _adopt(self) -> None:
        """Take over the leases the scheduler's commit took for this replica (as ``_claim`` would have)."""
        placed, self.ctx.placed_leases = self.ctx.placed_leases, {}
        for job_id, (token, until) in placed.items():
            self._leases[job_id] = token
            self._lease_until[job_id] = until
            self._adopted.add(job_id)

    async def _load(
        self, scope: frozenset[str] | None = None
    ) -> tuple[list[JobRec], dict[str, InstanceRec], set[str], dict[str, RunRec]]:
        """The active jobs (those of ``scope`` only, if given), their instances, which of them another replica
        holds, and the runs of those to start (read here with the rest, not once per job by its submission)."""
        async with self.ctx.db.read() as conn:
            active = await run_store.list_jobs(conn, ACTIVE_JOB, ids=scope)
            inst_ids = list({j.instance_id for j in active if j.instance_id})
            insts = {i.id: i for i in await fleet_store.list_instances_by_ids(conn, inst_ids)}
            # jobs this replica holds the leases of (handed over by its scheduler) are nobody else's
            others = [j.id for j in active if j.id not in self._adopted]
            elsewhere = set(await run_store.leased_elsewhere(conn, others, self.ctx.replica_id, time.time()))
            left_alone = self._submitting | elsewhere  # started already, or driven by another replica
            starting = {
                j.run_id
                for j in active
                if j.status == "provisioning" and not j.stop_requested and j.id not in left_alone
            }
            runs = await run_store.runs_by_ids(conn, list(starting)) if starting else {}
        return active, insts, elsewhere, runs

    async def _act(
        self,
        active: list[JobRec],
        insts: dict[str, InstanceRec],
        elsewhere: set[str],
        runs: dict[str, RunRec] | None = None,
    ) -> None:
        """Start the placed jobs (what ``_load`` read may be stale by now: the claims decide), follow the
        running ones, poke those to stop."""
        starts: list[tuple[JobRec, InstanceRec]] = []
        for job in active:
            if job.id in elsewhere:
                continue  # another replica drives it; its lease expires if that replica dies
            inst = insts.get(job.instance_id or "")
            if job.status == "provisioning":
                if job.stop_requested and job.id in self._submitting:
                    # its agent may be starting it now: the submission records the start, then its follower
                    # sends the stop (finishing the job here would leave the agent running it, followed by none)
                    self._stopped_in_flight.add(job.id)
                elif job.stop_requested:
                    await self._finish(job, JobState(job.id, "terminated"), stopped=job.stop_requested)
                    if job.id in self._adopted:
                        self._adopted.discard(job.id)
                        await self._release(job.id)
                elif (
                    inst is not None and inst.status in READY_INSTANCE and inst.agent and job.id not in self._submitting
                ):
                    starts.append((job, inst))
            elif job.id not in self._followers and inst is not None and inst.agent:
                self._follow(job, inst)
            elif job.stop_requested and job.id in self._pokes:
                self._pokes[job.id].set()
        # the leases of every job this pass starts and does not hold yet, in one transaction; each is submitted by
        # one task
        adopted = {j.id for j, _ in starts if j.id in self._adopted}
        fresh = [j.id for j, _ in starts if j.id not in adopted]
        held = adopted | (await self._claim_many(fresh, ("provisioning",)) if fresh else set())
        for job, inst in starts:
            if job.id in held and job.id not in self._submitting:
                self._adopted.discard(job.id)
                self._submitting.add(job.id)
                task = asyncio.create_task(self._submit_once(job, inst, (runs or {}).get(job.run_id)))
                self._submits.add(task)
                task.add_done_callback(self._done_submitting(job.id))
        # a lease adopted for a job this pass does not start (stopped, or its instance no longer ready): let it go,
        # for a whole pass to take the job on
        for job_id in list(self._adopted):
            if job_id not in self._submitting and job_id not in self._followers:
                self._adopted.discard(job_id)
                await self._release(job_id)

    def _done_submitting(self, job_id: str) -> Callable[[asyncio.Task[None]], None]:
        def done(task: asyncio.Task[None]) -> None:
            self._submitting.discard(job_id)
            self._stopped_in_flight.discard(job_id)
            self._submits.discard(task)

        return done

    async def stop_all(self) -> None:
        """Followers end at their next wait (poked now), so none is cancelled inside a write transaction
        (a cancelled statement can leave SQLite's write lock held, and every later writer waiting on it);
        one still busy after ``STOP_GRACE`` is cancelled. Submissions in flight go first: none is left to start a
        follower, or to write, once the database is closed. The leases the scheduler took for jobs not started yet
        are let go, for the next server or another replica to start them at once."""
        self._stopping = True
        self._adopt()
        for job_id in list(self._adopted):
            self._adopted.discard(job_id)
            await self._release(job_id)
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

    async def _submit_once(self, job: JobRec, inst: InstanceRec, run: RunRec | None = None) -> None:
        try:
            await self._submit(job, inst, run)
        finally:
            if job.id not in self._followers:
                await self._release(job.id)

    async def _submit(self, job: JobRec, inst: InstanceRec, run: RunRec | None = None) -> None:
        """Start the job on its agent (``run``: its run, as the pass read it, else read here)."""
        if await self._claim(job.id) is None:
            return
        if run is None:
            async with self.ctx.db.read() as conn:
                run = await run_store.get_run_by_id(conn, job.run_id)
        if run is None:
            return
        # the nodes of this job's replica (a service's other replicas are not its nodes)
        siblings = [j for j in run.jobs if j.submission_num == job.submission_num and j.replica_num == job.replica_num]
        sib_ids = {j.instance_id for j in siblings if j.instance_id}
        if sib_ids == {inst.id}:  # a single node's instance is the one the pass read
            sib_insts = [inst]
        else:
            async with self.ctx.db.read() as conn:
                sib_insts = await fleet_store.list_instances_by_ids(conn, list(sib_ids))
        ips = {i.id: "127.0.0.1" if i.backend == "local" else (i.hostname or "") for i in sib_insts}
        ordered = sorted(siblings, key=lambda j: j.job_num)
        nodes_ips = [ips.get(j.instance_id or "", "") for j in ordered]
        # Nodes on one host (the local backend) meet at their sandboxes' addresses; across hosts they keep
        # the hosts' network, where they reach each other.
        one_host = len(ordered) > 1 and all(i.backend == "local" for i in sib_insts)
        by_id = {i.id: i for i in sib_insts}
        ready = all(
            (x := by_id.get(j.instance_id or "")) is not None and x.agent and x.status in READY_INSTANCE
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
        conf = dict(run_configuration(run.run_spec))
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
        status = "pulling" if state.state == "pending" and submission.image else "running"
        stored_conf = dict(run_configuration(run.run_spec))
        # the follower's first long poll, sent now: a short job's end is on its way back while its start is
        # recorded (a job with a shorter first wait -- inactivity, utilization -- polls from its follower)
        first = None
        plain = inactivity.duration_of(stored_conf) is None and job_utilization.policy_of(job) is None
        if plain and not state.finished:
            wait = self.ctx.settings.agent_poll_wait
            first = asyncio.ensure_future(
                client.logs(job.id, job.log_offset, wait=wait, state=known_state(status), metrics_after=0)
            )
        # a job is not running before its SSH endpoint accepts connections
        try:
            ssh = await self.ctx.ssh_endpoint() if self.ctx.ssh_endpoint is not None else None
            now = time.time()
            values: dict[str, Any] = {
                "status": status,
                "last_processed_at": now,
                "ssh_seen_at": now,  # a dev environment's inactivity runs from its start
                "job_provisioning_data": provisioning_data(inst, job.id, ssh),
                "job_runtime_data": with_agent_state(runtime_data(submission, spec.get("working_dir")), state),
                "status_message": sandbox_message(state),
            }
            dumped = {k: dump(v) if k.startswith("job_") else v for k, v in values.items()}
            async with self.ctx.db.write() as conn:
                ok = await run_store.update_job(conn, job.id, dumped, expect_status=("provisioning",))
        except BaseException:
            if first is not None:
                first.cancel()
            raise
        if ok:
            self.ctx.wakeups.wake_for("runs", (job.run_id,))
            if state.finished or job.id not in self._followers:
                # the follower has the run's stored configuration, and the job as just written with its first poll
                # (unless a stop was asked for meanwhile: then it reads the job afresh, and sends the stop at once)
                if job.id in self._stopped_in_flight and first is not None:
                    first.cancel()
                    first = None
                started = Started(dataclasses.replace(job, **values), first) if first is not None else None
                self._follow(job, inst, stored_conf, started)
                return
        if first is not None:
            first.cancel()

    def _local_sandboxed(self) -> bool:
        """Whether the local backend's agents run host-process jobs in a sandbox (their own network)."""
        local = self.ctx.computes.get("local")
        return local is not None and sandbox_reason(local) is None

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
