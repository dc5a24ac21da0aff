"""The scheduling worker: load the queue and fleets, decide (pure ``schedule``), commit (``plan_apply``).

Runs when woken (a job submitted, capacity freed, a fleet changed) and on the safety-net interval.
A gang the commit point rejected (someone else took the capacity meanwhile) is re-planned at once.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import weakref
from collections.abc import Mapping
from typing import Any

from corral.backends.base import is_shared_host, sandbox_reason
from corral.context import Context
from corral.domain.documents import spec_configuration
from corral.domain.job_facts import JobFacts
from corral.domain.resources import Requirements
from corral.domain.telemetry import Telemetry
from corral.domain.volumes import VolumeRec, volume_names
from corral.scheduler.fleet_upkeep import upkeep
from corral.scheduler.queue_order import QueueOrder
from corral.scheduler.types import (
    Assign,
    Fail,
    FleetSlot,
    Gang,
    Plan,
    QueuedJob,
    Reclaim,
    Reserve,
    Snapshot,
    WaitPolicy,
)
from corral.store import queue_reader
from corral.store import snapshot as snap
from corral.store import volumes as volume_store
from corral.store.fleet_reader import FleetReader
from corral.store.holdings_reader import HoldingsReader
from corral.store.plan_apply import apply_plan
from corral.store.plan_result import ApplyResult, JobLease
from corral.store.queue_reader import QueueChange, QueueReader
from corral.store.snapshot import QueueRow
from corral.workers.queued_jobs import from_facts, stored_facts
from corral.workers.run_settle import settle_placed
from corral.workers.scheduling_passes import PassChoice
from corral.workers.scheduling_preemption import Preempter
from corral.workers.scheduling_quotas import load_policies, project_quotas, project_shares
from corral.workers.snapshot_builder import SnapshotBuilder

log = logging.getLogger("corral.scheduler")


class Scheduling:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        #: The queue as the last pass read it, as the scheduler takes it: by job id, and in the order a pass
        #: takes it, kept as the queue changes (a pass sorts nothing).
        self._order = QueueOrder()
        #: The ids of those of a run with its own capacity ``reservation`` (usually none).
        self._reserving: set[str] = set()
        #: The queue's rows the last pass read: the next pass handles only what changed.
        self._reader = QueueReader()
        #: The fleets and instances the last pass read: the next pass reads whole only the instances that changed.
        self._fleets = FleetReader()
        #: The projects' holdings the last pass read (while a policy is set): read again where an instance moved,
        #: and whole when ``_holdings_whole_at`` is a safety-net interval old.
        self._holdings = HoldingsReader()
        self._holdings_whole_at = float("-inf")
        #: The requirements of the queued jobs, each distinct one once (entries go with the last job using them).
        self._requirements: weakref.WeakValueDictionary[Requirements, Requirements] = weakref.WeakValueDictionary()
        #: job id -> its run's configuration type (``task``, ``service``, ...), for ``GET /metrics``.
        self._run_types: dict[str, str] = {}
        #: The fleets as the scheduler sees them (each fleet's requirements and offers kept).
        self.snapshots = SnapshotBuilder(ctx.computes)
        #: (project id, name) -> the live volumes, loaded when a job that mounts some is first queued.
        self._volume_places: dict[tuple[str, str], VolumeRec] = {}
        self.preempter = Preempter(ctx)
        #: A whole pass, or one over the queue's head (``workers/scheduling_passes.py``).
        self.passes = PassChoice(ctx.settings.safety_net_interval)

    def _parsed(self, job: QueueRow) -> QueuedJob:
        """A job first seen, as the scheduler takes it: from its scheduling facts (derived from its documents,
        once, for a job stored without them)."""
        facts = job.facts if job.facts is not None else stored_facts(job.run_spec, job.job_spec)
        parsed = from_facts(
            facts,
            id=job.id,
            run_id=job.run_id,
            project_id=job.project_id,
            project_name=job.project_name,
            run_name=job.run_name,
            job_num=job.job_num,
            replica_num=job.replica_num,
            priority=job.priority,
            submitted_at=job.submitted_at if job.queued_at is None else job.queued_at,
            max_queue_wait=self.ctx.settings.max_queue_wait,
            barred_backends=self._barred_backends(job, facts),
            volume_places=self._volume_places,
        )
        changes: dict[str, Any] = {"status_message": job.status_message}
        if job.queued_at is not None:  # a preempted job's new submission waits for its place, whatever its retry
            changes["wait"] = WaitPolicy(True, None)
        # one object per distinct requirement (a sweep's jobs ask alike): a pass tells shapes apart by
        # identity first, so it hashes each distinct requirement once instead of once per queued job
        same = self._requirements.setdefault(parsed.requirements, parsed.requirements)
        if same is not parsed.requirements:
            changes["requirements"] = same
        self._run_types[job.id] = facts.run_type
        return dataclasses.replace(parsed, **changes)

    def _take(self, change: QueueChange) -> list[Gang]:
        """Bring ``_order`` to the queue just read: the jobs that left it go, the changed ones get their new
        priority and status message, the fresh ones are parsed. A fresh job whose stored spec cannot be read
        is failed (the gangs returned) and read whole again by the next pass, should it still wait."""
        for job_id in change.gone:
            self._order.remove(job_id)
            self._reserving.discard(job_id)
            self._run_types.pop(job_id, None)
        for job_id, priority, message in change.changed:
            cached = self._order.get(job_id)
            if cached is not None:
                self._order.put(dataclasses.replace(cached, priority=priority, status_message=message))
        failed: list[Gang] = []
        for row in change.fresh:
            try:
                job = self._parsed(row)
                self._order.put(job)
                if job.reservation is not None:
                    self._reserving.add(job.id)
            except Exception as e:  # a stored spec we cannot read: fail the job, never the worker
                log.exception("cannot schedule job %s", row.id)
                self._reader.forget(row.id)
                failed.append(Gang(row.run_id, (Fail(row.id, f"corral cannot read this job's stored spec: {e}"),)))
        return failed

    def _wake_after(self, result: ApplyResult, lease_until: float) -> None:
        """Hand the jobs this replica starts over, and wake the workers that act on what was committed."""
        if result.reserved or result.reclaimed:
            self.ctx.wakeups.wake("instances")
        self.ctx.hand_over(result.leased, lease_until)  # placed on a ready instance: started by this replica
        if len(result.assigned) > len(result.leased):  # placed on an instance still starting: whoever drives it
            self.ctx.wakeups.wake("jobs")
        if result.failed:
            self.ctx.wakeups.wake("runs")
        elif result.assigned:  # the placed jobs' runs the commit did not settle: this process's runs pass, for those
            placed = (self._order.get(job_id) for job_id in result.assigned)
            unsettled = {q.run_id for q in placed if q is not None} - result.settled_runs
            if unsettled:
                self.ctx.wakeups.wake_for("runs", unsettled)
        if result.rejected_runs:
            self.ctx.wakeups.wake("scheduler")

    async def _queue_now(self, change: QueueChange) -> tuple[list[Gang], list[QueuedJob], QueueOrder | None]:
        """The queue brought to ``change`` (``_take``: the gangs of the jobs it fails), as this pass takes it,
        with its kept order where the pass may use it (None: a run with its own reservation waits, and its
        jobs are told where that is: they are not those of the order)."""
        failed = self._take(change)
        prune_to = self._reader.prune_due()
        if prune_to is not None:  # the queue's changes read, and older ones: no longer needed
            async with self.ctx.db.write() as conn:
                await queue_reader.prune(conn, prune_to)
        self.passes.came(r.id for r in change.fresh if r.id in self._order.jobs)
        waiting = list(self._order.jobs.values())
        if not self._reserving:
            return failed, waiting, self._order
        return failed, await self.snapshots.reserved.located(waiting), None  # where the runs' reservations are

    def _barred_backends(self, job: QueueRow, facts: JobFacts) -> frozenset[str]:
        """The local backend, for a host-process job of a run whose submitter is not a global admin, while
        the local agents have no sandbox (``services.local_admission``). Checked here as well as at apply:
        a queued run may reach a local fleet exported to its project after it was admitted."""
        reason = sandbox_reason(self.ctx.computes.get("local"))
        if reason is None or job.submitter_role == "admin":
            return frozenset()
        if facts.has_image or self.ctx.settings.default_image:
            return frozenset()
        return frozenset({"local"})

    def backend_limits(self) -> dict[str, int]:
        return {"local": self.ctx.settings.local_max_instances} if "local" in self.ctx.computes else {}

    def host_pools(self) -> dict[str, int]:
        """Backends whose instances are carved out of one host: backend -> the host's blocks."""
        local = self.ctx.computes.get("local")
        return {"local": int(local.host_blocks())} if is_shared_host(local) else {}

    async def pass_once(self) -> ApplyResult:
        """One load -> decide -> commit pass. Returns what was committed."""
        now = time.time()
        async with self.ctx.db.read() as conn:
            change = await self._reader.read(conn)
            if any(r.facts.volumes if r.facts else volume_names(spec_configuration(r.run_spec)) for r in change.fresh):
                self._volume_places = {(v.project_id, v.name): v for v in await volume_store.list_volumes(conn, None)}
            fleets = await self._fleets.read(conn)
            pools = self.host_pools()
            local_used, local_blocks = await snap.backend_usage_and_blocks(conn, "local")
            pool_used = {b: local_blocks if b == "local" else await snap.host_blocks_used(conn, b) for b in pools}
            await self.snapshots.refresh(conn)
            whole = now - self._holdings_whole_at >= self.ctx.settings.safety_net_interval
            policies, holdings = await load_policies(conn, self._holdings, self._fleets.live, whole)
            if whole and policies:
                self._holdings_whole_at = now
        await self.snapshots.reserved.resolve(fleets)  # capacity reservations EC2 was not asked about yet
        slots = tuple(self.snapshots.fleet_slot(f) for f in fleets)
        self.snapshots.keep_only({f.id for f in fleets})  # caches keep only fleets that still exist
        failed_parse, queued, order = await self._queue_now(change)
        live = self._order.jobs.keys()
        limits = self.backend_limits()
        holds = await self.preempter.holds(queued, now)
        names = self._order.project_names() if policies else {}
        snapshot = Snapshot(
            fleets=slots,
            queue=tuple(queued),
            backend_limits={"local": (local_used, limits["local"])} if "local" in limits else {},
            host_pools={b: (pool_used[b], total) for b, total in pools.items()},
            hold_after=self.ctx.settings.starvation_guard,
            quotas=project_quotas(policies, holdings, names),
            shares=project_shares(policies, holdings, set(names)),
            holds=holds,
        )
        plan = self.passes.plan(snapshot, now, self.ctx.preemption.enabled, order)
        # what the plan leaves of each host, for nodes.min upkeep (never a reservation plan_apply must refuse)
        host_free = {b: total - used for b, (used, total) in snapshot.host_pools.items()}
        for d in (d for g in plan.gangs for d in g.decisions):
            if isinstance(d, Reserve) and d.offer.host_blocks and d.offer.backend in host_free:
                host_free[d.offer.backend] -= d.offer.host_blocks
        upkeep_gangs = [Gang(f"upkeep:{f.id}", (r,)) for f in slots for r in upkeep(f, host_free)]
        if upkeep_gangs or failed_parse:
            plan = Plan(plan.gangs + tuple(upkeep_gangs) + tuple(failed_parse))
        lease = JobLease(self.ctx.replica_id, self.ctx.settings.job_lease_ttl)
        result = await apply_plan(
            self.ctx.db, plan, now, limits, pools, holds=self.ctx.preemption.enabled, lease=lease, settle=settle_placed
        )
        self.passes.planned(plan, live)
        count_outcomes(self.ctx.telemetry, result, self._order.jobs, self._run_types, now)
        if result.assigned or result.failed:
            log_outcomes(plan, result, self._order.jobs, slots)
        self._wake_after(result, now + lease.ttl)
        await self.preempter.pass_once(snapshot, plan, policies, now)
        return result


def count_outcomes(
    telemetry: Telemetry, result: ApplyResult, jobs: Mapping[str, QueuedJob], run_types: dict[str, str], now: float
) -> None:
    """The pass's placements, refused gangs and queue waits, for ``GET /metrics`` (``jobs``: the queue's by id)."""
    if result.rejected_runs:
        telemetry.inc("corral_commit_rejections_total", by=len(result.rejected_runs))
    if not result.assigned:
        return
    telemetry.inc("corral_placements_total", by=len(result.assigned))
    for job_id in result.assigned:
        job = jobs.get(job_id)
        if job is None:
            continue
        waited = max(0.0, now - job.submitted_at)
        telemetry.observe("corral_queue_wait_seconds", waited, {"project": job.project_name})
        if job.job_num == 0:
            labels = {"project_name": job.project_name, "run_type": run_types.get(job_id, "")}
            telemetry.observe("dstack_submit_to_provision_duration_seconds", waited, labels)


def log_outcomes(plan: Plan, result: ApplyResult, jobs: Mapping[str, QueuedJob], fleets: tuple[FleetSlot, ...]) -> None:
    """One INFO line per job this pass placed (on which instance, or a new one in which fleet) or failed
    (``jobs``: the queue's by id)."""
    instances = {i.id: (i.name, f.name) for f in fleets for i in f.instances}
    fleet_names = {f.id: f.name for f in fleets}
    assigned, failed = set(result.assigned), set(result.failed)
    for gang in plan.gangs:
        for d in gang.decisions:
            job = jobs.get(d.job_id) if not isinstance(d, Reclaim) and d.job_id else None
            if job is None:
                continue
            what = f"run {job.run_name} job {job.job_num}"
            fields = {"run_name": job.run_name, "job_num": job.job_num, "project": job.project_name}
            if isinstance(d, Assign) and d.job_id in assigned:
                name, fleet = instances.get(d.instance_id, (d.instance_id, "?"))
                log.info(
                    "%s placed on instance %s of fleet %s",
                    what,
                    name,
                    fleet,
                    extra={"event": "job_placed", "instance": name, "fleet": fleet, **fields},
                )
            elif isinstance(d, Reserve) and d.job_id in assigned:
                fleet = fleet_names.get(d.fleet_id, d.fleet_id)
                log.info(
                    "%s placed on a new %s instance of fleet %s",
                    what,
                    d.offer.backend,
                    fleet,
                    extra={"event": "job_placed", "fleet": fleet, "backend": d.offer.backend, **fields},
                )
            elif isinstance(d, Fail) and d.job_id in failed:
                log.info("%s failed: %s", what, d.message, extra={"event": "job_failed", **fields})
