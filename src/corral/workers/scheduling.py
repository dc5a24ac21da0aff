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

from corral import config  # lazy: the models load on first use, not at start-up
from corral.backends.base import SharedHost, sandbox_reason
from corral.context import Context
from corral.domain.access import usable_computes
from corral.domain.fleets import fleet_blocks, fleet_placement, nodes_bounds
from corral.domain.records import FleetRec
from corral.domain.resources import Requirements, match_requirements
from corral.domain.selectors import FleetRef, Selector
from corral.domain.telemetry import Telemetry
from corral.domain.volumes import VolumeRec, placement, volume_names
from corral.scheduler import offer_filters
from corral.scheduler.codec import offer_from_json
from corral.scheduler.fleet_upkeep import upkeep
from corral.scheduler.types import (
    Assign,
    Fail,
    FleetSlot,
    Gang,
    InstanceSlot,
    Offer,
    Plan,
    QueuedJob,
    Reclaim,
    Reserve,
    Snapshot,
    WaitPolicy,
)
from corral.store import exports as export_store
from corral.store import project_state
from corral.store import snapshot as snap
from corral.store import volumes as volume_store
from corral.store.plan_apply import apply_plan
from corral.store.plan_result import ApplyResult, JobLease
from corral.store.queue_reader import QueueChange, QueueReader
from corral.store.snapshot import QueueRow
from corral.workers.reserved_offers import ReservedOffers
from corral.workers.scheduling_passes import PassChoice
from corral.workers.scheduling_preemption import Preempter
from corral.workers.scheduling_quotas import load_policies, project_quotas, project_shares

log = logging.getLogger("corral.scheduler")

DEFAULT_RETRY_DURATION = 3600.0
_LOCAL_BACKENDS = {None, "local", "remote"}


def wait_policy(retry: Any, submitted_at: float, server_max: float | None) -> WaitPolicy:
    """How long a job may wait for capacity, from its ``retry`` (DESIGN.md, queue semantics)."""
    if retry is None:
        return WaitPolicy(True, None if server_max is None else submitted_at + server_max)
    if retry is False:
        return WaitPolicy(False)
    if retry is True:
        return WaitPolicy(True, submitted_at + DEFAULT_RETRY_DURATION)
    events = getattr(retry, "on_events", None)
    if events is not None and "no-capacity" not in {getattr(e, "value", e) for e in events}:
        return WaitPolicy(False)
    duration = getattr(retry, "duration", None)
    return WaitPolicy(True, submitted_at + float(duration if duration is not None else DEFAULT_RETRY_DURATION))


def _service_replica_wait(conf: Any, job_spec: dict[str, Any]) -> WaitPolicy | None:
    """A service's replicas after the first wait for capacity whatever its ``retry`` says: one replica
    without room must not fail the service its others serve (the service's own clock, ``retry.duration``
    with no replica ready, ends it; ``workers.service_health``)."""
    if getattr(conf, "type", None) == "service" and int(job_spec.get("replica_num") or 0) > 0:
        return WaitPolicy(True, None)
    return None


def queued_job(
    run_spec: dict[str, Any],
    job_spec: dict[str, Any],
    *,
    id: str,
    run_id: str,
    project_id: str,
    project_name: str,
    run_name: str,
    job_num: int,
    priority: int,
    submitted_at: float,
    max_queue_wait: float | None,
    barred_backends: frozenset[str] = frozenset(),
    volume_places: Mapping[tuple[str, str], VolumeRec] | None = None,
) -> QueuedJob:
    """A job as the scheduler sees it, from its run's and its own stored documents."""
    conf = config.parse_run_configuration(run_spec["configuration"])
    profile = config.effective_profile(config.parse_profile(run_spec.get("profile")), conf)
    resources = config.ResourcesSpec.model_validate(job_spec["requirements"]["resources"])
    fleets = None
    if profile.fleets is not None:
        fleets = tuple(f.format() if hasattr(f, "format") else str(f) for f in profile.fleets)
    nodes = int(conf.nodes_num) if conf.type == "task" else 1
    selectors = None if profile.instances is None else tuple(to_selector(x) for x in profile.instances)
    job_filter = offer_filters.run_filter(profile)
    backends, regions, zones = job_filter.backends, job_filter.regions, None
    names = volume_names(run_spec["configuration"])
    if names:  # placement follows the volumes: their backend, region and zone
        places = volume_places or {}
        missing = [n for n in names if (project_id, n) not in places]
        if missing:
            raise ValueError(f"volume {', '.join(missing)} not found (deleted since the run was submitted?)")
        backend, region, zone = placement([places[(project_id, n)] for n in names])
        backends, regions = frozenset({backend}), frozenset({region.lower()})
        zones = frozenset({zone}) if zone else None
    return QueuedJob(
        id=id,
        run_id=run_id,
        project_id=project_id,
        run_name=run_name,
        job_num=job_num,
        priority=priority,
        submitted_at=submitted_at,
        requirements=resources.to_requirements(),
        fleet_names=fleets,
        creation_policy=getattr(profile.creation_policy, "value", str(profile.creation_policy)),
        wait=_service_replica_wait(conf, job_spec) or wait_policy(profile.retry, submitted_at, max_queue_wait),
        nodes=nodes,
        multinode=nodes > 1,
        project_name=project_name,
        selectors=selectors,
        barred_backends=barred_backends,
        backends=backends,
        max_price=job_filter.max_price,
        regions=regions,
        zones=zones,
        instance_types=job_filter.instance_types,
        spot=job_filter.spot,
        replica_num=int(job_spec.get("replica_num") or 0),
        reservation=str(profile.reservation) if profile.reservation else None,
    )


class Scheduling:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        #: The queue as the last pass read it, as the scheduler takes it, by job id.
        self._queued: dict[str, QueuedJob] = {}
        #: The queue's rows the last pass read: the next pass handles only what changed.
        self._reader = QueueReader()
        #: The requirements of the queued jobs, each distinct one once (entries go with the last job using them).
        self._requirements: weakref.WeakValueDictionary[Requirements, Requirements] = weakref.WeakValueDictionary()
        #: job id -> its run's configuration type (``task``, ``service``, ...), for ``GET /metrics``.
        self._run_types: dict[str, str] = {}
        self._fleet_reqs: dict[tuple[str, str], Requirements | None] = {}
        self._fleet_offers: dict[tuple[str, str, str], tuple[Offer, ...]] = {}
        #: fleet id -> ids of the projects it is exported to (refreshed every pass).
        self.importers: dict[str, frozenset[str]] = {}
        #: project id -> the backend types it has (refreshed every pass): a fleet gets offers only from those.
        self.project_backends: dict[str, frozenset[str]] = {}
        #: Project id -> backend type -> the regions the project's backend names (offers come from those).
        self.project_regions: dict[str, dict[str, frozenset[str]]] = {}
        #: (project id, name) -> the live volumes, loaded when a job that mounts some is first queued.
        self._volume_places: dict[tuple[str, str], VolumeRec] = {}
        self.preempter = Preempter(ctx)
        self.reserved = ReservedOffers(ctx)
        #: A whole pass, or one over the queue's head (``workers/scheduling_passes.py``).
        self.passes = PassChoice(ctx.settings.safety_net_interval)

    def _parsed(self, job: QueueRow) -> QueuedJob:
        """A job first seen, as the scheduler takes it (its documents read once)."""
        if job.job_spec is None or job.run_spec is None:
            raise ValueError("the job's documents were not loaded")
        parsed = queued_job(
            job.run_spec,
            job.job_spec,
            id=job.id,
            run_id=job.run_id,
            project_id=job.project_id,
            project_name=job.project_name,
            run_name=job.run_name,
            job_num=job.job_num,
            priority=job.priority,
            submitted_at=job.submitted_at if job.queued_at is None else job.queued_at,
            max_queue_wait=self.ctx.settings.max_queue_wait,
            barred_backends=self._barred_backends(job),
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
        self._run_types[job.id] = str((job.run_spec.get("configuration") or {}).get("type") or "")
        return dataclasses.replace(parsed, **changes)

    def _take(self, change: QueueChange) -> list[Gang]:
        """Bring ``_queued`` to the queue just read: the jobs that left it go, the changed ones get their new
        priority and status message, the fresh ones are parsed. A fresh job whose stored spec cannot be read
        is failed (the gangs returned) and read whole again by the next pass, should it still wait."""
        for job_id in change.gone:
            self._queued.pop(job_id, None)
            self._run_types.pop(job_id, None)
        for job_id, priority, message in change.changed:
            cached = self._queued.get(job_id)
            if cached is not None:
                self._queued[job_id] = dataclasses.replace(cached, priority=priority, status_message=message)
        failed: list[Gang] = []
        for row in change.fresh:
            try:
                self._queued[row.id] = self._parsed(row)
            except Exception as e:  # a stored spec we cannot read: fail the job, never the worker
                log.exception("cannot schedule job %s", row.id)
                self._reader.forget(row.id)
                failed.append(Gang(row.run_id, (Fail(row.id, f"corral cannot read this job's stored spec: {e}"),)))
        return failed

    def _barred_backends(self, job: QueueRow) -> frozenset[str]:
        """The local backend, for a host-process job of a run whose submitter is not a global admin, while
        the local agents have no sandbox (``services.local_admission``). Checked here as well as at apply:
        a queued run may reach a local fleet exported to its project after it was admitted."""
        reason = sandbox_reason(self.ctx.computes.get("local"))
        if reason is None or job.submitter_role == "admin" or job.run_spec is None:
            return frozenset()
        if job.run_spec.get("configuration", {}).get("image") or self.ctx.settings.default_image:
            return frozenset()
        return frozenset({"local"})

    async def snapshot_for(
        self, conn: Any, queue: tuple[QueuedJob, ...], project_ids: list[str] | None = None, importer: str | None = None
    ) -> Snapshot:
        """The fleets (of ``project_ids``; None: all) as the next pass would see them, with ``queue`` (for a
        plan's verdict). With ``importer``, only whether that project imports them is loaded."""
        fleets = await self.load_for(conn, project_ids, importer)
        return Snapshot(fleets=tuple(self.fleet_slot(f) for f in fleets), queue=queue)

    async def load_for(
        self, conn: Any, project_ids: list[str] | None = None, importer: str | None = None
    ) -> list[FleetRec]:
        """The fleets (of ``project_ids``; None: all) and what their slots are built from, loaded for a plan:
        :meth:`fleet_slot` makes each one's slot (once the caller, with no transaction open, had their
        capacity reservations resolved)."""
        fleets = await snap.load_fleets(conn, project_ids)
        self.importers = await export_store.fleet_importers(conn, project_ids, importer)
        self.project_backends, self.project_regions = await project_state.backends_and_regions(conn, project_ids)
        return fleets

    def _fleet_requirements(self, fleet: FleetRec) -> Requirements | None:
        key = (fleet.id, str(fleet.spec.get("configuration", {}).get("resources")))
        if key not in self._fleet_reqs:
            raw = fleet.spec.get("configuration", {}).get("resources")
            self._fleet_reqs[key] = (
                config.ResourcesSpec.model_validate(raw).to_requirements() if raw is not None else None
            )
        return self._fleet_reqs[key]

    def fleet_offers(self, fleet: FleetRec) -> tuple[Offer, ...]:
        """The backends' offers the fleet's ``backends`` and ``resources`` allow (cached per fleet spec:
        backends' offers do not change while the server runs)."""
        conf = fleet.spec.get("configuration", {})
        if conf.get("ssh_config"):
            return ()
        backends = self.project_backends.get(fleet.project_id, frozenset())
        regions = self.project_regions.get(fleet.project_id, {})
        key = (
            fleet.id,
            repr((sorted(backends), conf.get("backends"), sorted((k, sorted(v)) for k, v in regions.items()))),
            repr((conf.get("resources"), self.reserved.known(fleet))),
        )
        cached = self._fleet_offers.get(key)
        if cached is None:
            cached = self._fleet_offers[key] = self._match_offers(fleet, conf)
        return cached

    def _match_offers(self, fleet: FleetRec, conf: dict[str, Any]) -> tuple[Offer, ...]:
        allowed = conf.get("backends")
        offers: list[Offer] = []
        for name in usable_computes(self.ctx.computes, self.project_backends.get(fleet.project_id, frozenset())):
            if allowed and name not in allowed and not ({"local", "remote"} & set(allowed)):
                continue
            offers.extend(self.ctx.computes[name].offers())
        req = self._fleet_requirements(fleet)
        if req is not None:
            offers = [o for o in offers if match_requirements(req, o.resources) is None]
        offers = offer_filters.in_project_regions(offers, self.project_regions.get(fleet.project_id, {}))
        offers = self.reserved.narrowed(fleet, offers)  # a ``reservation``'s type in its region
        # ``backends`` was applied above (with its own rule for ``local``/``remote``)
        return tuple(offer_filters.filtered(offers, offer_filters.from_conf({**conf, "backends": None})))

    def fleet_slot(self, fleet: FleetRec) -> FleetSlot:
        nodes_min, nodes_max = nodes_bounds(fleet.spec)
        slots = []
        for i in fleet.instances:
            if i.status == "terminated":
                continue
            offer = offer_from_json(i.offer) if i.offer else None
            slots.append(
                InstanceSlot(
                    id=i.id,
                    fleet_id=fleet.id,
                    name=i.name,
                    instance_num=i.instance_num,
                    # a host removed from its fleet while busy takes no new work: it leaves once free
                    status="terminating" if i.termination_reason and i.status in ("idle", "busy") else i.status,
                    resources=offer.resources if offer else None,
                    total_blocks=i.total_blocks or 1,
                    busy_blocks=i.busy_blocks,
                    unreachable=i.unreachable,
                    price=i.price or 0.0,
                    hostname=i.hostname,
                    addresses=tuple((i.agent or {}).get("addresses") or ([i.hostname] if i.hostname else [])),
                    backend=i.backend,
                    host_blocks=offer.host_blocks if offer else 0,
                    offer=offer,
                )
            )
        return FleetSlot(
            id=fleet.id,
            project_id=fleet.project_id,
            name=fleet.name,
            nodes_min=nodes_min,
            nodes_max=nodes_max,
            blocks=fleet_blocks(fleet.spec),
            placement=fleet_placement(fleet.spec),
            offers=self.fleet_offers(fleet),
            instances=tuple(slots),
            backend_limit_key="local",
            project_name=fleet.project_name,
            importer_project_ids=self.importers.get(fleet.id, frozenset()),
            reservation=self.reserved.reservation(fleet),
        )

    def backend_limits(self) -> dict[str, int]:
        return {"local": self.ctx.settings.local_max_instances} if "local" in self.ctx.computes else {}

    def host_pools(self) -> dict[str, int]:
        """Backends whose instances are carved out of one host: backend -> the host's blocks."""
        local = self.ctx.computes.get("local")
        return {"local": int(local.host_blocks())} if isinstance(local, SharedHost) else {}

    async def pass_once(self) -> ApplyResult:
        """One load -> decide -> commit pass. Returns what was committed."""
        now = time.time()
        async with self.ctx.db.read() as conn:
            change = await self._reader.read(conn)
            if any(volume_names(r.run_spec["configuration"]) for r in change.fresh if r.run_spec is not None):
                self._volume_places = {(v.project_id, v.name): v for v in await volume_store.list_volumes(conn, None)}
            fleets = await snap.load_fleets(conn)
            pools = self.host_pools()
            local_used, local_blocks = await snap.backend_usage_and_blocks(conn, "local")
            pool_used = {b: local_blocks if b == "local" else await snap.host_blocks_used(conn, b) for b in pools}
            self.importers = await export_store.fleet_importers(conn)
            self.project_backends, self.project_regions = await project_state.backends_and_regions(conn)
            policies, holdings = await load_policies(conn)
        await self.reserved.resolve(fleets)  # capacity reservations EC2 was not asked about yet
        slots = tuple(self.fleet_slot(f) for f in fleets)
        live_fleets = {f.id for f in fleets}  # caches keep only fleets that still exist
        self._fleet_offers = {k: v for k, v in self._fleet_offers.items() if k[0] in live_fleets}
        self._fleet_reqs = {k: v for k, v in self._fleet_reqs.items() if k[0] in live_fleets}
        failed_parse = self._take(change)
        queued = await self.reserved.located(list(self._queued.values()))  # where the runs' reservations are
        live = self._queued.keys()
        limits = self.backend_limits()
        holds = await self.preempter.holds(queued, now)
        names = {q.project_id: q.project_name for q in queued} if policies else {}  # (a step per job: policies only)
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
        plan = self.passes.plan(snapshot, now, self.ctx.preemption.enabled)
        # what the plan leaves of each host, for nodes.min upkeep (never a reservation plan_apply must refuse)
        host_free = {b: total - used for b, (used, total) in snapshot.host_pools.items()}
        for d in (d for g in plan.gangs for d in g.decisions):
            if isinstance(d, Reserve) and d.offer.host_blocks and d.offer.backend in host_free:
                host_free[d.offer.backend] -= d.offer.host_blocks
        upkeep_gangs = [Gang(f"upkeep:{f.id}", (r,)) for f in slots for r in upkeep(f, host_free)]
        if upkeep_gangs or failed_parse:
            plan = Plan(plan.gangs + tuple(upkeep_gangs) + tuple(failed_parse))
        lease = JobLease(self.ctx.replica_id, self.ctx.settings.job_lease_ttl)
        result = await apply_plan(self.ctx.db, plan, now, limits, pools, holds=self.ctx.preemption.enabled, lease=lease)
        self.passes.planned(plan, live)
        count_outcomes(self.ctx.telemetry, result, self._queued, self._run_types, now)
        if result.assigned or result.failed:
            log_outcomes(plan, result, self._queued, slots)
        if result.reserved or result.reclaimed:
            self.ctx.wakeups.wake("instances")
        self.ctx.hand_over(result.leased, now + lease.ttl)  # placed on a ready instance: started by this replica
        if len(result.assigned) > len(result.leased):  # placed on an instance still starting: whoever drives it
            self.ctx.wakeups.wake("jobs")
        if result.failed:
            self.ctx.wakeups.wake("runs")
        elif result.assigned:  # the placed jobs' runs go to provisioning: this process's runs pass, for those
            placed = (self._queued.get(job_id) for job_id in result.assigned)
            self.ctx.wakeups.wake_for("runs", {q.run_id for q in placed if q is not None})
        if result.rejected_runs:
            self.ctx.wakeups.wake("scheduler")
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


def to_selector(sel: Any) -> Selector:
    """A configuration selector (``config.profiles``) as the scheduler's pure value."""
    if getattr(sel, "name", None) is not None and not hasattr(sel, "instance"):
        return Selector(name=sel.name)
    if getattr(sel, "hostname", None) is not None:
        return Selector(hostname=sel.hostname)
    fleet = sel.fleet
    return Selector(fleet=FleetRef(fleet.name, fleet.project), instance_num=int(sel.instance))


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
