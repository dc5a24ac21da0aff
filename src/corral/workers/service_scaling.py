"""The service scaling worker: every ``service_scaling_tick`` (and when woken, ``services``) each live
service's replica groups are reconciled -- rollouts to the run's deployment one replica at a time, and
the desired count of each group (``replicas``, or ``scaling`` on the requests every server replica's
proxy counted: ``domain.autoscaling``).

Load (the live services, their replicas and counted requests) -> decide (pure: ``decide_service``, on
``domain.rollout``) -> apply (one short transaction per service that changes). A replica leaving rotation
gets ``drain_at`` (the proxies stop routing to it; in-flight requests go on) and is stopped
``scaled_down`` once no server replica has a request in flight to it (``store.service_drains``), or
``service_drain_timeout`` later at the latest. A rollout whose new replica does not become ready keeps
the old ones serving, and the run's ``status_message`` says why.

Two server replicas deciding the same step insert the same (run, replica, submission): the unique index
makes one of them roll back.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from corral.context import Context
from corral.domain.autoscaling import DEFAULT_WINDOW, Scaling, desired_count
from corral.domain.retry import needs_retry_evaluation
from corral.domain.rollout import Phase, ReplicaView, allocate_numbers, decide_group
from corral.domain.statuses import FINISHED_JOB
from corral.scheduler.schedule import WAITING_FOR_CAPACITY
from corral.store import service_drains
from corral.store import service_scaling as store
from corral.store.errors import Conflict
from corral.store.service_scaling import JobView, ServiceState

log = logging.getLogger("corral.services")
#: Fields of a job spec that differ between replicas of one deployment.
_PER_REPLICA = ("replica_num", "job_name", "registry_auth")
_ENDED = FINISHED_JOB


@dataclass(frozen=True)
class GroupConf:
    name: str
    low: int
    high: int
    scaling: Scaling | None


@dataclass(frozen=True)
class ServiceDecision:
    #: group name -> replica numbers to start from its template
    start: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    bump: tuple[str, ...] = ()
    drain: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()
    message: str | None = None
    wake_at: float | None = None

    def changes(self) -> bool:
        return bool(any(self.start.values()) or self.bump or self.drain or self.stop)


def group_confs(conf: Mapping[str, Any], window_override: float | None) -> list[GroupConf]:
    """Each replica group's range and scaling, from the stored configuration (dstack's wire form)."""

    def scaling(raw: Any) -> Scaling | None:
        if not isinstance(raw, dict):
            return None
        window = window_override or float(raw.get("window") or DEFAULT_WINDOW)
        return Scaling(float(raw["target"]), window, float(raw["scale_up_delay"]), float(raw["scale_down_delay"]))

    groups = conf.get("groups")
    if isinstance(groups, list) and groups:
        out = []
        for i, g in enumerate(groups):
            rng = g.get("replicas") or g.get("count") or {"min": 1, "max": 1}
            name = str(g.get("name") or i)
            out.append(GroupConf(name, int(rng.get("min") or 0), int(rng["max"]), scaling(g.get("scaling"))))
        return out
    rng = conf.get("replicas") or {"min": 1, "max": 1}
    return [GroupConf("0", int(rng.get("min") or 0), int(rng["max"]), scaling(conf.get("scaling")))]


def _spec_key(text: str) -> dict[str, Any]:
    spec = orjson.loads(text)
    return {k: v for k, v in spec.items() if k not in _PER_REPLICA}


def _group_of(j: JobView) -> str:
    return str(orjson.loads(j.job_spec).get("replica_group") or "0")


def _latest(jobs: Sequence[JobView]) -> dict[int, JobView]:
    out: dict[int, JobView] = {}
    for j in sorted(jobs, key=lambda j: j.submission_num):
        out[j.replica_num] = j
    return out


def _active(j: JobView) -> bool:
    """A replica that holds a place: not ended (and not being scaled down), or failed and to be
    submitted again (``workers/service_health``)."""
    if j.stop_requested == "scaled_down":
        return False
    if j.status not in _ENDED:
        return True
    return needs_retry_evaluation(j.status, j.termination_reason)


def _phase(j: JobView) -> Phase:
    if j.drain_at is not None and j.status not in _ENDED:
        return Phase.DRAINING
    if j.status == "running" and j.ready:
        return Phase.READY
    return Phase.STARTING


ROLLOUT_MESSAGE = "Rollout to deployment"


def _why_stuck(new: Sequence[JobView], deployment: int) -> str:
    """What the run's status message says while a rollout waits on its new replica."""
    head = f"{ROLLOUT_MESSAGE} {deployment} in progress; the previous deployment keeps serving: "
    for j in new:
        if j.status == "failed" or (j.status in _ENDED and needs_retry_evaluation(j.status, j.termination_reason)):
            detail = j.termination_reason_message or j.termination_reason or j.status
            return head + f"new replica {j.replica_num} failed ({detail}); it is submitted again"
    for j in new:
        if j.status == "submitted":
            wait = j.status_message or "waiting to be placed"
            return head + f"new replica {j.replica_num} cannot be placed yet ({wait})"
    for j in new:
        if j.status == "running" and not j.ready:
            return head + f"new replica {j.replica_num} has not passed its probes"
    return head + "new replica starting"


def _waiting_to_be_placed(j: JobView) -> bool:
    """The scheduler left the replica in the queue for lack of room: it fits its fleets but they are full."""
    message = j.status_message or ""
    return j.status == "submitted" and j.instance_id is None and message.startswith(WAITING_FOR_CAPACITY)


def decide_service(
    svc: ServiceState,
    requests: Mapping[str, int] | None,
    now: float,
    drain_timeout: float,
    window_override: float | None = None,
    held: Collection[str] | None = None,
) -> ServiceDecision:
    """The service's next step (pure). ``requests``: requests counted over each group's window, by group
    name (None: no stats). ``held``: the draining replicas some server replica may have requests in
    flight to (None: all of them)."""
    latest = _latest(svc.jobs)
    by_group: dict[str, list[JobView]] = {}
    for j in latest.values():
        by_group.setdefault(_group_of(j), []).append(j)
    confs = group_confs(svc.configuration, window_override)
    names = {c.name for c in confs}
    start: dict[str, tuple[int, ...]] = {}
    bump: list[str] = []
    drain: list[str] = []
    stop: list[str] = []
    wakes: list[float] = []
    stuck: list[JobView] = []
    taken = [j.replica_num for j in latest.values() if _active(j)]
    inactive = [j.replica_num for j in latest.values() if not _active(j) and j.status in _ENDED]
    for group, members in by_group.items():  # replicas of a group no longer in the configuration
        if group not in names:
            for j in members:
                if _active(j) and j.status not in _ENDED:
                    (drain if _phase(j) == Phase.READY else stop).append(j.id)
    for gc in confs:
        template = svc.templates.get(gc.name)
        if template is None:
            continue
        members = by_group.get(gc.name, [])
        active = [j for j in members if _active(j)]
        current = sum(1 for j in active if _phase(j) != Phase.DRAINING)
        dated = [j.submitted_at for j in members] + [j.finished_at for j in members if j.finished_at is not None]
        last_scaled = max(dated) if dated else None
        got = None if requests is None else requests.get(gc.name, 0)
        desired = desired_count(current, gc.low, gc.high, gc.scaling, got, last_scaled, now)
        tkey = _spec_key(template["job_spec"])
        views = [
            ReplicaView(
                j.id,
                j.replica_num,
                j.deployment_num,
                _phase(j),
                same_spec=j.deployment_num < svc.deployment_num and _spec_key(j.job_spec) == tkey,
                drain_at=j.drain_at,
                held=held is None or j.id in held,
                waiting_for_capacity=_waiting_to_be_placed(j),
            )
            for j in active
        ]
        d = decide_group(views, svc.deployment_num, desired, now, drain_timeout)
        numbers = allocate_numbers(d.start, inactive, taken)
        taken += numbers
        inactive = [n for n in inactive if n not in numbers]
        if numbers:
            start[gc.name] = tuple(numbers)
        bump += d.bump
        drain += d.drain
        stop += d.stop
        if d.wake_at is not None:
            wakes.append(d.wake_at)
        if d.rolling:
            bumped = set(d.bump)
            stuck += [
                j
                for j in active
                if j.deployment_num >= svc.deployment_num and j.id not in bumped and _phase(j) == Phase.STARTING
            ]
    message = _why_stuck(stuck, svc.deployment_num) if stuck else None
    return ServiceDecision(start, tuple(bump), tuple(drain), tuple(stop), message, min(wakes) if wakes else None)


class ServiceScaling:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._stopping = False
        self._last_prune = 0.0
        self._event = asyncio.Event()
        # a replica's readiness changed, a run was updated, counts rose from zero: look again now
        ctx.wakeups.listen("services", self._event.set)

    async def run(self) -> None:
        event = self._event
        while not self._stopping:
            try:
                await self.pass_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if not self.ctx.lacked_space("the service scaling pass", e):
                    log.exception("service scaling pass failed")
            else:
                self.ctx.went_through("the service scaling pass")
            try:
                await asyncio.wait_for(event.wait(), timeout=self.ctx.settings.service_scaling_tick)
            except asyncio.TimeoutError:
                pass
            event.clear()

    def stop(self) -> None:
        self._stopping = True

    async def pass_once(self) -> None:  # noqa: C901
        settings = self.ctx.settings
        now = time.time()
        async with self.ctx.db.read() as conn:
            services = await store.live_services(conn)
            windows: dict[float, list[str]] = {}
            for svc in services:
                for gc in group_confs(svc.configuration, settings.service_scaling_window):
                    if gc.scaling is not None:
                        windows.setdefault(gc.scaling.window, []).append(svc.run_id)
            counted: dict[tuple[str, float], int] = {}
            for window, ids in windows.items():
                # whole seconds before the current one (the proxies flush each second once it is over)
                since = int(now) - math.ceil(window)
                for run_id, n in (await store.requests_since(conn, sorted(set(ids)), since)).items():
                    counted[(run_id, window)] = n
            draining = [j.id for svc in services for j in svc.jobs if j.drain_at is not None and j.status not in _ENDED]
            held = set(await service_drains.holders(conn, draining))
        changed = False
        for svc in services:
            per_group = {
                gc.name: counted.get((svc.run_id, gc.scaling.window), 0)
                for gc in group_confs(svc.configuration, settings.service_scaling_window)
                if gc.scaling is not None
            }
            d = decide_service(
                svc, per_group, now, settings.service_drain_timeout, settings.service_scaling_window, held
            )
            mine = svc.status_message is None or svc.status_message.startswith(ROLLOUT_MESSAGE)
            message_changes = mine and d.message != svc.status_message
            if not d.changes() and not message_changes:
                continue
            views = {j.id: j for j in svc.jobs}
            try:
                async with self.ctx.db.write() as conn:
                    for group, numbers in d.start.items():
                        await store.add_replicas(conn, svc, svc.templates[group], numbers, now)
                    await store.bump(conn, d.bump, svc.deployment_num)
                    await store.drain(conn, d.drain, now)
                    await store.scale_down(conn, [views[i] for i in d.stop], now)
                    await service_drains.forget(conn, d.stop)
                    if message_changes:
                        await store.set_message(conn, svc.run_id, d.message)
            except Conflict:
                continue  # another server replica took this step first
            if d.changes():
                changed = True
                log.info(
                    "service %s: start %s, in place %d, drain %d, stop %s",
                    svc.run_name,
                    dict(d.start) or "none",
                    len(d.bump),
                    len(d.drain),
                    [(views[i].replica_num, views[i].status, views[i].stop_requested) for i in d.stop] or "none",
                )
        if changed:
            self.ctx.wakeups.wake("services", "scheduler", "jobs", "runs")
        if now - self._last_prune > 30:
            self._last_prune = now
            async with self.ctx.db.write() as conn:
                await store.prune_requests(conn, int(now) - store.STATS_KEEP)
                await service_drains.prune(conn)
