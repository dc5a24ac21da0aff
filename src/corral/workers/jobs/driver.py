"""The jobs worker's pass: hand placed jobs to their instance's agent, follow them, stop them.

A job the scheduler of this replica placed on a ready instance comes leased already (``Context.placed_leases``):
the pass it wakes reads only those jobs and starts them; any other placed job is claimed first. :class:`Jobs`
holds its parts rather than inheriting them: the replica's leases on its jobs (:class:`JobLeases`), what is
recorded from the agents (:class:`JobOutcomes`), the submissions in flight (:class:`Submissions`) and one
follower task per running job (:class:`Followers`), which long-polls its agent for output and state. An agent
that stays unreachable past ``agent_unreachable_timeout`` fails the job ``instance_unreachable``.

May import: corral.domain, corral.store, corral.context, the agent client and this package's leases, outcomes,
follower and submission.
"""

from __future__ import annotations

import time

from corral.agent.protocol import JobState
from corral.backends.agent_client import AgentClient
from corral.backends.base import AgentEndpoint
from corral.context import Context
from corral.domain.records import InstanceRec, JobRec, RunRec
from corral.domain.statuses import ACTIVE_JOB, READY_INSTANCE
from corral.store import fleets as fleet_store
from corral.store import runs as run_store
from corral.workers.jobs.follower import Followers
from corral.workers.jobs.leases import JobLeases
from corral.workers.jobs.outcomes import JobOutcomes
from corral.workers.jobs.submission import Submissions

#: How long a stopping server waits for its job followers to end at their next wait before cancelling them.
STOP_GRACE = 5.0


class Jobs:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._clients: dict[tuple[str, str], AgentClient] = {}
        self.leases = JobLeases(ctx.db, ctx.replica_id, ctx.settings.job_lease_ttl)
        self.outcomes = JobOutcomes(ctx)
        self.followers = Followers(ctx, self.leases, self.outcomes, self.client)
        self.submissions = Submissions(ctx, self.leases, self.outcomes, self.followers, self.client)
        #: Jobs whose lease the scheduler's commit took for this replica, not yet handed to a submission task.
        self._adopted: set[str] = set()

    def client(self, inst: InstanceRec) -> AgentClient:
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
        """Take over the leases the scheduler's commit took for this replica (as a claim would have)."""
        placed, self.ctx.placed_leases = self.ctx.placed_leases, {}
        for job_id, (token, until) in placed.items():
            self.leases.adopt(job_id, token, until)
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
            left_alone = self.submissions.in_flight_ids() | elsewhere  # started already, or driven elsewhere
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
                ready = await self._placed(job, inst)
                if ready is not None:
                    starts.append((job, ready))
            elif not self.followers.following(job.id) and inst is not None and inst.agent:
                self.followers.follow(job, inst)
            elif job.stop_requested:
                self.followers.poke(job.id)
        await self._start(starts, runs or {})
        # a lease adopted for a job this pass does not start (stopped, or its instance no longer ready): let it go,
        # for a whole pass to take the job on
        for job_id in list(self._adopted):
            if not self.submissions.in_flight(job_id) and not self.followers.following(job_id):
                self._adopted.discard(job_id)
                await self.leases.release(job_id)

    async def _placed(self, job: JobRec, inst: InstanceRec | None) -> InstanceRec | None:
        """The instance to start a placed job on now, if it is to be started; a stopped one is ended (or its
        submission told)."""
        if job.stop_requested and self.submissions.in_flight(job.id):
            # its agent may be starting it now: the submission records the start, then its follower sends the
            # stop (finishing the job here would leave the agent running it, followed by none)
            self.submissions.stop_requested(job.id)
        elif job.stop_requested:
            await self.outcomes.finish(job, JobState(job.id, "terminated"), stopped=job.stop_requested)
            if job.id in self._adopted:
                self._adopted.discard(job.id)
                await self.leases.release(job.id)
        elif (
            inst is not None and inst.status in READY_INSTANCE and inst.agent and not self.submissions.in_flight(job.id)
        ):
            return inst
        return None

    async def _start(self, starts: list[tuple[JobRec, InstanceRec]], runs: dict[str, RunRec]) -> None:
        """The leases of every job this pass starts and does not hold yet, in one transaction; each is submitted
        by one task."""
        adopted = {j.id for j, _ in starts if j.id in self._adopted}
        fresh = [j.id for j, _ in starts if j.id not in adopted]
        held = adopted | (await self.leases.claim_many(fresh, ("provisioning",)) if fresh else set())
        for job, inst in starts:
            if job.id in held and not self.submissions.in_flight(job.id):
                self._adopted.discard(job.id)
                self.submissions.start(job, inst, runs.get(job.run_id))

    async def stop_all(self) -> None:
        """Followers end at their next wait (poked now), so none is cancelled inside a write transaction
        (a cancelled statement can leave SQLite's write lock held, and every later writer waiting on it);
        one still busy after ``STOP_GRACE`` is cancelled. Submissions in flight go first: none is left to start a
        follower, or to write, once the database is closed. The leases the scheduler took for jobs not started yet
        are let go, for the next server or another replica to start them at once."""
        self.followers.halt()
        self._adopt()
        for job_id in list(self._adopted):
            self._adopted.discard(job_id)
            await self.leases.release(job_id)
        await self.submissions.wait(STOP_GRACE)
        await self.followers.stop(STOP_GRACE)
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()
