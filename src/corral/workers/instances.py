"""The instances worker: provision reserved instances, terminate the ones going away, retire idle ones,
and finish deleted fleets. Every backend call happens with no transaction open, under a lease.

A provisioning keeps its rows' leases (renewed every third of their time to live) for as long as the backend works
on them, however long that is (a Slurm allocation may pend for many minutes): another replica takes a pending row
over only once the replica that holds it has stopped renewing, i.e. has died.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence

from corral.backends.base import AgentEndpoint, Compute, Provisioned, ProvisioningError
from corral.context import Context
from corral.domain.costs import placed_price
from corral.domain.durations import idle_limit
from corral.domain.events import instance_target
from corral.domain.fleets import nodes_bounds, stuck_message
from corral.domain.provisioning import STATUS_WORDS, FailureKind
from corral.domain.records import IdleClock, InstanceRec
from corral.domain.statuses import ENDING_INSTANCE, UNFINISHED_INSTANCE
from corral.scheduler.codec import offer_to_json, resources_to_json
from corral.scheduler.fallbacks import FALLBACKS_KEY
from corral.store import fleets as fleet_store
from corral.store import instance_outcomes, leases
from corral.store.encryption import seal
from corral.store.events import EXPIRED_BATCH, delete_expired, emit
from corral.store.instance_outcomes import ProvisionedInstance
from corral.store.tables import instances
from corral.workers.gangs import Gangs
from corral.workers.orphans import OrphanReaper
from corral.workers.seal_at_rest import seal_stored_secrets

log = logging.getLogger("corral.instances")

#: Seconds between two deletions of expired events by one replica (dstack: 7 minutes).
EVENTS_CLEANUP_INTERVAL = 7 * 60.0


class Instances:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._events_cleaned_at: float | None = None
        #: Instance id -> (failed tries to terminate it, when the first failed), while it is not confirmed.
        self._termination_tries: dict[str, tuple[int, float]] = {}
        self.orphans = OrphanReaper(ctx)
        self.gangs = Gangs(ctx, self._claim, self.record, self._provisioning_failed, self.keeping)

    async def pass_once(self) -> None:
        async with self.ctx.db.read() as conn:
            todo = await fleet_store.list_instances(conn, statuses=("pending", "terminating"))
            idle = await fleet_store.idle_clocks(conn)
        fresh = [i for i in todo if i.status == "pending" and i.id not in self._tasks]
        for ids, gang in await self.gangs.start(fresh):  # a multi-node run's instances: all together
            for iid in ids:
                self._tasks[iid] = gang
                gang.add_done_callback(self._untrack(iid))
        for inst in todo:
            if inst.id in self._tasks or inst.id in self.gangs.waiting:
                continue
            work = self._provision(inst) if inst.status == "pending" else self._terminate(inst)
            task = asyncio.create_task(work)
            self._tasks[inst.id] = task
            task.add_done_callback(self._untrack(inst.id))
        await self._retire_idle(idle)
        await self._finish_fleets()
        await self._expire_events()
        await self.orphans.pass_once()

    async def _expire_events(self) -> None:
        """Delete events older than the TTL, a batch per pass at most every ``EVENTS_CLEANUP_INTERVAL``
        (an indexed range of ``recorded_at``): a short write however long the history."""
        ttl, now = self.ctx.settings.events_ttl, time.time()
        if ttl <= 0 or (
            self._events_cleaned_at is not None and now - self._events_cleaned_at < EVENTS_CLEANUP_INTERVAL
        ):
            return
        async with self.ctx.db.write() as conn:
            deleted = await delete_expired(conn, now - ttl)
        # a full batch: more are due, taken on the next pass
        self._events_cleaned_at = None if deleted >= EXPIRED_BATCH else now

    def _untrack(self, key: str) -> Callable[[asyncio.Task[None]], None]:
        def done(_task: asyncio.Task[None]) -> None:
            self._tasks.pop(key, None)

        return done

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def _lease_ttl(self) -> float:
        return self.ctx.settings.provisioning_timeout + 5

    @contextlib.asynccontextmanager
    async def keeping(self, held: Sequence[tuple[str, str]]) -> AsyncIterator[None]:
        """The leases ``held`` (row id, token) renewed while the body runs, so that no other replica takes the
        rows over while this one still works on them (a lost one is said and left: ``record`` then finds it)."""
        ttl = self._lease_ttl()

        async def renew() -> None:
            while True:
                await asyncio.sleep(ttl / 3)
                try:
                    async with self.ctx.db.write() as conn:
                        for row_id, token in held:
                            if not await leases.extend(conn, instances, row_id, token, time.time(), ttl):
                                log.warning("instance %s: its lease was lost while it was provisioned", row_id)
                except Exception as e:  # the database away for a moment: the next renewal tries again
                    log.warning("renewing provisioning leases failed: %s", e)

        task = asyncio.create_task(renew())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _claim(self, inst: InstanceRec) -> str | None:
        ttl = self._lease_ttl()
        async with self.ctx.db.write() as conn:
            return await leases.claim(
                conn, instances, inst.id, self.ctx.replica_id, time.time(), ttl, expect_status=(inst.status,)
            )

    async def _provision(self, inst: InstanceRec) -> None:
        token = await self._claim(inst)
        if token is None:
            return
        compute = self.ctx.computes.get(inst.backend)
        try:
            if compute is None:
                raise ProvisioningError(f"backend {inst.backend!r} is not configured")
            async with self.keeping([(inst.id, token)]):
                provisioned = await compute.create_instance(inst)
        except ProvisioningError as e:  # its kind says why: no capacity, a quota, no image...
            await self._provisioning_failed(inst, token, str(e), kind=e.kind)
            return
        except Exception as e:  # never leave an instance stuck in pending
            log.exception("provisioning %s failed", inst.name)
            await self._provisioning_failed(inst, token, f"unexpected error: {e}")
            return
        # the instance runs: recorded once the database has room again (a lease lost meanwhile terminates it)
        await self.ctx.until_it_fits(
            f"the record of instance {inst.name}", lambda: self.record(inst, token, compute, provisioned)
        )

    async def record(self, inst: InstanceRec, token: str, compute: Compute, provisioned: Provisioned) -> None:
        """Record a provisioned instance (under its lease ``token``); terminated again if the row moved on."""
        now = time.time()
        # An instance reserved without an offer (an SSH host) gets one from what was found there.
        offer = dict(inst.offer or {"backend": inst.backend, "instance_type": inst.backend, "region": inst.region})
        launched = provisioned.offer  # a cloud launched one of the reservation's fallbacks instead
        if launched is not None:
            offer = {**offer, **offer_to_json(launched)}
        offer.pop(FALLBACKS_KEY, None)
        offer.setdefault("price", inst.price or 0.0)
        offer["resources"] = resources_to_json(provisioned.resources)
        # the agent's token is stored sealed (opened by whoever calls the agent: ``Context.reveal``)
        stored_agent = {
            **provisioned.agent.to_json(),
            "token": seal(self.ctx.cipher(), provisioned.agent.token),
            "addresses": _addresses(provisioned),
        }
        found = ProvisionedInstance(
            agent=stored_agent,
            hostname=provisioned.hostname,
            offer=offer,
            total_blocks=provisioned.total_blocks or inst.total_blocks,
            region=offer.get("region") or inst.region,
            price=offer["price"],
            jobs_price=placed_price(inst.backend, offer["price"]) if launched is not None else None,
            status_message=provisioned.status_message,
        )
        async with self.ctx.db.write() as conn:
            recorded_now = await instance_outcomes.record_provisioned(conn, inst.id, token, found, now)
        if not recorded_now:  # lost the lease, or the instance is being terminated meanwhile
            async with self.ctx.db.read() as conn:
                now_rec = await fleet_store.get_instance(conn, inst.id)
            recorded = (now_rec.agent or {}).get("url") if now_rec is not None else None
            if recorded != provisioned.agent.url:  # never kill an agent another replica recorded (adopted)
                await compute.terminate_instance(inst.id, provisioned.agent)
            self.ctx.wakeups.wake("instances")  # a row terminated meanwhile ends on the next pass, not the safety net
            return
        res_json = offer["resources"]
        log.info(
            "instance %s of fleet %s provisioned on %s (%s cpus, %s MiB memory, %d gpus)%s",
            inst.name,
            inst.fleet_name,
            inst.backend,
            res_json.get("cpus"),
            res_json.get("memory_mib"),
            len(res_json.get("gpus") or []),
            f" at {provisioned.hostname}" if provisioned.hostname else "",
            extra={"event": "instance_provisioned", "instance": inst.name, "fleet": inst.fleet_name},
        )
        self.ctx.wakeups.wake("jobs", "scheduler")

    async def _provisioning_failed(
        self,
        inst: InstanceRec,
        token: str,
        message: str,
        reason: str = "failed_to_start_due_to_no_capacity",
        kind: FailureKind = "refused",
    ) -> None:
        log.info(
            "instance %s of fleet %s could not be provisioned: %s",
            inst.name,
            inst.fleet_name,
            message,
            extra={"event": "instance_failed", "instance": inst.name, "fleet": inst.fleet_name},
        )
        now = time.time()
        async with self.ctx.db.write() as conn:
            await instance_outcomes.record_provisioning_failed(
                conn, inst.id, token, inst.name, message, (reason, STATUS_WORDS[kind]), now
            )
        self.ctx.wakeups.wake("runs", "scheduler", "instances")  # "instances": a deleted fleet it was the last of ends

    async def _terminate(self, inst: InstanceRec) -> None:
        token = await self._claim(inst)
        if token is None:
            return
        compute = self.ctx.computes.get(inst.backend)
        agent = AgentEndpoint.from_json(inst.agent).opened(self.ctx.reveal) if inst.agent else None
        try:
            if compute is not None:
                await compute.terminate_instance(inst.id, agent)
        except Exception as e:
            log.warning("terminating %s failed; will retry: %s", inst.name, e)
            tries, since = self._termination_tries.get(inst.id, (0, time.time()))
            self._termination_tries[inst.id] = (tries + 1, since)
            message = stuck_message(tries + 1, self.ctx.settings.termination_stuck_tries, since, str(e))
            async with self.ctx.db.write() as conn:
                await leases.release(conn, instances, inst.id, token)
                if message is not None:  # once: the event and the instance's message say it is stuck
                    log.warning("instance %s: %s", inst.name, message, extra={"event": "termination_stuck"})
                    await fleet_store.update_instance(
                        conn, inst.id, {"termination_reason_message": message}, expect_status=("terminating",)
                    )
                    await emit(
                        conn, message, None, [instance_target(inst.project_id, inst.id, inst.name, inst.fleet_id)]
                    )
            return
        self._termination_tries.pop(inst.id, None)
        now = time.time()
        async with self.ctx.db.write() as conn:
            # jobs still bound to a terminated instance cannot go on: they are terminated with it
            await instance_outcomes.record_terminated(conn, inst.id, token, inst.name, now)
        log.info(
            "instance %s of fleet %s terminated%s",
            inst.name,
            inst.fleet_name,
            f" ({inst.termination_reason})" if inst.termination_reason else "",
            extra={"event": "instance_terminated", "instance": inst.name, "fleet": inst.fleet_name},
        )
        # "instances" too: a deleted fleet whose last instance this was is finished by the next pass.
        self.ctx.wakeups.wake("scheduler", "runs", "jobs", "instances")

    async def _retire_idle(self, idle: list[IdleClock]) -> None:
        now = time.time()
        due = []
        for inst in idle:
            limit = idle_limit(inst.idle_duration, inst.backend, self.ctx.settings.default_fleet_idle_duration)
            if limit >= 0 and now - inst.since >= limit:
                due.append(inst)
        if not due:
            return
        async with self.ctx.db.write() as conn:
            for inst in due:
                if inst.fleet_id is None:
                    continue
                fleet = await fleet_store.get_fleet(conn, inst.project_id, fleet_id=inst.fleet_id)
                if fleet is None:
                    continue
                nodes_min, _ = nodes_bounds(fleet.spec)
                live = [i for i in fleet.instances if i.status not in ENDING_INSTANCE]
                if len(live) <= nodes_min:
                    continue
                await fleet_store.update_instance(
                    conn,
                    inst.id,
                    {
                        "status": "terminating",
                        "termination_reason": "idle_timeout",
                        "termination_reason_message": f"Idle for {int(now - (inst.last_job_finished_at or now))}s",
                    },
                    expect_status=("idle",),
                )
        self.ctx.wakeups.wake("instances")

    async def _finish_fleets(self) -> None:
        async with self.ctx.db.write() as conn:
            for fleet in await fleet_store.list_fleets(conn, None, statuses=("terminating",)):
                if all(i.status == "terminated" for i in fleet.instances):
                    await fleet_store.update_fleet(conn, fleet.id, {"status": "terminated", "deleted": True})

    async def recover(self) -> None:
        """At start-up: seal the secrets that rows from before hold in clear, find the agents of live instances
        again, and reap those nobody owns."""
        await seal_stored_secrets(self.ctx)
        async with self.ctx.db.read() as conn:
            live = await fleet_store.list_instances(conn, statuses=UNFINISHED_INSTANCE)
        for name, compute in self.ctx.computes.items():
            known = {i.id for i in live if i.backend == name}
            reaped = await compute.reap_unknown(known)
            if reaped:
                log.info("reaped %d agent(s) with no instance record", len(reaped))
        # Pending instances whose lease died with a previous server are re-provisioned by the normal pass
        # (their lease has expired or is cleared here, since this process is the only server on SQLite).
        async with self.ctx.db.write() as conn:
            if self.ctx.db.is_sqlite:
                await instance_outcomes.drop_all_leases(conn)


def _addresses(p: Provisioned) -> list[str]:
    """Everything an ``instances`` hostname selector may name: hostname, internal IP, host addresses."""
    seen: list[str] = []
    for a in (p.hostname, p.internal_ip, *p.addresses):
        if a and a not in seen:
            seen.append(a)
    return seen
