"""Host upkeep on its own interval (``instance_check_interval``), apart from the wake-up driven workers.

Every provisioned instance's agent is asked for ``/health``. A failed check asks the instance's backend
to bring the agent back (an SSH host that rebooted without systemd gets its agent started again); two
failures in a row set the instance's ``unreachable`` flag -- a flag beside its status, as in dstack:
the scheduler gives it no work. An instance its backend made (a local agent, a cloud VM) whose agent stays
lost past the backend's bound (``Settings.unreachable_timeout``) is given up: its jobs fail
``instance_unreachable`` and it is terminated, so that its place in the fleet is free for a replacement
(``domain/lost_hosts.py``). A host the backend was given (SSH) stays flagged; its jobs fail by the same bound
through the jobs worker. The first answer afterwards clears the flag, stops jobs the
agent still runs that the server no longer runs there, and wakes the scheduler: the host is used again.

Each instance is checked by its own task, so a host whose SSH handshake is slow delays only itself; at most
``CHECKS_AT_ONCE`` checks talk to agents at a time, and a check's timeout starts when it does. Thousands of
hosts checked all at once (each exchange through its SSH tunnel) made a round longer than the request
timeout on a busy server: the checks at the back timed out waiting for the server's own loop, and healthy
hosts were flagged unreachable and bootstrapped again (``benchmarks/hollow_fleet.py``, 2,000 SSH hosts).
Cloud backends are asked, in a task of their own, which of their instances they took away
(``workers.interruptions``).
Hosts removed from an SSH fleet while busy leave here once they are free.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from corral.backends.agent_client import AgentClient, AgentClientError
from corral.backends.base import AgentEndpoint
from corral.context import Context
from corral.domain.lost_hosts import HostHealth, Verdict, after_check, verdict
from corral.domain.records import InstanceRec
from corral.domain.statuses import HOLDING_JOB, READY_INSTANCE
from corral.store import fleets as fleet_store
from corral.store import instance_outcomes
from corral.store import runs as run_store
from corral.workers.interruptions import Interruptions

log = logging.getLogger("corral.hosts")

_RUNNING_HERE = HOLDING_JOB
#: Health checks talking to agents at once; the others wait their turn before their timeout starts (the
#: recovery after a failed check, an SSH login, waits for no turn).
CHECKS_AT_ONCE = 32


class Hosts:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._health: dict[str, HostHealth] = {}
        self._checks: dict[str, asyncio.Task[None]] = {}
        self._clients: dict[tuple[str, str], AgentClient] = {}
        self.interruptions = Interruptions(ctx)
        self._asking: asyncio.Task[int] | None = None
        self._slots = asyncio.Semaphore(CHECKS_AT_ONCE)

    async def run(self) -> None:
        while True:
            try:
                await self.pass_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if not self.ctx.lacked_space("the host checks", e):
                    log.exception("host checks failed")
            else:
                self.ctx.went_through("the host checks")
            await asyncio.sleep(self.ctx.settings.instance_check_interval)

    async def pass_once(self) -> None:
        if self._asking is None or self._asking.done():
            self._asking = asyncio.create_task(self._ask_clouds())
        async with self.ctx.db.read() as conn:
            live = [i for i in await fleet_store.list_instances(conn, statuses=READY_INSTANCE) if i.agent]
        ids = {i.id for i in live}
        removed = [i.id for i in live if i.status == "idle" and i.backend == "ssh" and i.termination_reason]
        if removed:
            await self._retire_removed(removed)
        self._health = {k: v for k, v in self._health.items() if k in ids}
        for inst in live:
            if inst.id not in self._checks:
                task = asyncio.create_task(self._check(inst))
                self._checks[inst.id] = task
                task.add_done_callback(self._forget_check(inst.id))

    async def _ask_clouds(self) -> int:
        try:
            return await self.interruptions.pass_once()
        except Exception:
            log.exception("asking the clouds for lost instances failed")
            return 0

    def _forget_check(self, instance_id: str) -> Callable[[asyncio.Task[None]], None]:
        def done(_task: asyncio.Task[None]) -> None:
            self._checks.pop(instance_id, None)

        return done

    async def stop(self) -> None:
        if self._asking is not None:
            self._asking.cancel()
            await asyncio.gather(self._asking, return_exceptions=True)
        for task in list(self._checks.values()):
            task.cancel()
        await asyncio.gather(*self._checks.values(), return_exceptions=True)
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()

    def _client(self, inst: InstanceRec) -> AgentClient:
        stored = AgentEndpoint.from_json(inst.agent or {"token": ""}).token  # sealed: opened once per client
        key = (self.ctx.agent_url(inst), stored)
        client = self._clients.get(key)
        if client is None:
            token = self.ctx.reveal(stored)
            client = self._clients[key] = AgentClient(key[0], token, timeout=self.ctx.settings.agent_request_timeout)
        return client

    async def _answers(self, inst: InstanceRec) -> bool:
        try:
            await self._client(inst).health()
            return True
        except AgentClientError:
            return False

    async def _check(self, inst: InstanceRec) -> None:
        async with self._slots:
            started = time.time()
            ok = await self._answers(inst)
        if not ok:
            compute = self.ctx.computes.get(inst.backend)
            try:
                if compute is not None:
                    await compute.recover(inst)
                    async with self._slots:
                        ok = await self._answers(inst)
            except Exception as e:  # the host itself is not there (or refuses us): counted below
                log.debug("recovering %s: %s", inst.name, e)
        health = self._health[inst.id] = after_check(self._health.get(inst.id, HostHealth()), ok, started)
        compute = self.ctx.computes.get(inst.backend)
        bound = self.ctx.settings.unreachable_timeout(inst.backend)
        replaceable = compute is not None and compute.owns_hosts
        step = verdict(health, inst.unreachable, time.time(), bound, replaceable)
        if step is Verdict.HEALTHY:
            self._health.pop(inst.id, None)
            if inst.unreachable:
                await self._reachable_again(inst)
        elif step is Verdict.FLAG:
            await self._flag(inst, health)
        elif step is Verdict.GIVE_UP:
            await self._give_up(inst, bound)

    async def _flag(self, inst: InstanceRec, health: HostHealth) -> None:
        log.warning(
            "instance %s of fleet %s is unreachable (lost: no answer to %d health checks); it takes no new work",
            inst.name,
            inst.fleet_name,
            health.failures,
            extra={"event": "instance_lost", "instance": inst.name, "fleet": inst.fleet_name},
        )
        async with self.ctx.db.write() as conn:
            await fleet_store.update_instance(conn, inst.id, {"unreachable": True, "last_processed_at": time.time()})
        self.ctx.wakeups.wake("scheduler")

    async def _give_up(self, inst: InstanceRec, bound: float) -> None:
        message = f"The instance's agent stopped answering for {bound:g}s; the instance is terminated"
        async with self.ctx.db.write() as conn:
            given_up = await instance_outcomes.record_unreachable(conn, inst.id, message, time.time())
        self._health.pop(inst.id, None)
        if not given_up:
            return
        log.warning(
            "instance %s of fleet %s given up: its agent did not answer for %gs; its jobs fail instance_unreachable "
            "and it is terminated",
            inst.name,
            inst.fleet_name,
            bound,
            extra={"event": "instance_given_up", "instance": inst.name, "fleet": inst.fleet_name},
        )
        self.ctx.wakeups.wake("instances", "runs", "jobs", "scheduler")

    async def _reachable_again(self, inst: InstanceRec) -> None:
        log.info("instance %s is reachable again", inst.name)
        await self._stop_strays(inst)
        async with self.ctx.db.write() as conn:
            await fleet_store.update_instance(conn, inst.id, {"unreachable": False, "last_processed_at": time.time()})
        self.ctx.wakeups.wake("scheduler", "jobs")

    async def _stop_strays(self, inst: InstanceRec) -> None:
        """Jobs the agent kept running while the server, not hearing from it, failed them."""
        client = self._client(inst)
        try:
            states = await client.list_jobs()
        except AgentClientError:
            return
        for state in states:
            if state.finished:
                continue
            async with self.ctx.db.read() as conn:
                job = await run_store.get_job(conn, state.job_id)
            if job is None or job.instance_id != inst.id or job.status not in _RUNNING_HERE:
                log.warning("stopping job %s left running on %s", state.job_id, inst.name)
                try:
                    await client.stop(state.job_id, abort=True)
                except AgentClientError:
                    pass

    async def _retire_removed(self, instance_ids: list[str]) -> None:
        """A host taken out of its SSH fleet while busy was marked; now that it is idle, it leaves."""
        retired = False
        async with self.ctx.db.write() as conn:
            for instance_id in instance_ids:
                retired |= await fleet_store.update_instance(
                    conn, instance_id, {"status": "terminating"}, expect_status=("idle",)
                )
        if retired:
            self.ctx.wakeups.wake("instances")
