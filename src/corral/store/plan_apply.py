"""THE capacity commit point: the only writer of job->instance assignments and instance reservations.

``apply_plan`` commits a scheduler ``Plan`` in one short write transaction. For each gang (the jobs of
one run) it locks what the decisions touch -- the fleet row for a reservation, the instance row for an
assignment (``SELECT ... FOR UPDATE`` on Postgres; SQLite's ``BEGIN IMMEDIATE`` already excludes every
other writer) -- recounts from current rows, and commits the gang whole or not at all (a savepoint). The
rows a whole plan will lock are locked first, in one order (its fleets', then its instances', each sorted by
id): gang by gang in plan order, two replicas' plans touching the same instances in different orders each held
one and waited for the other's (Postgres: ``deadlock detected``; ``benchmarks/hollow_fleet.py --postgres``).

A new instance carved out of a shared host (the local machine) is committed only while the blocks of
that host held by live instances, recounted from their rows, leave room for it; it is given the host's
GPUs (indexes, recorded in its offer) that none of those instances owns.

What ``nodes.max`` caps is every instance of the fleet that is not yet confirmed terminated:
reserved-but-not-provisioned, provisioning, idle, busy and terminating ones, recounted in this
transaction (:mod:`corral.store.capacity_counts` reads what a reservation counts). Free blocks of an
instance are recounted from the unfinished jobs assigned to it, never taken from a stale counter.
A gang of a project with a ``quota.max`` is committed only while what the project's provisioning,
pulling, running and stopping jobs hold, recounted from their rows after the gang's writes, stays within
it (a dimension already above the max, e.g. after the max was lowered, may not grow; how it is counted:
:mod:`corral.store.quota_count`). With preemption on,
an assignment takes only what is free beyond the blocks a preemption freed for another waiting run
(``store.plan_holds``). Such projects are
locked first (an advisory lock each, in id order, before the backend locks and any row lock), so that
commits from several replicas for one project are counted one after the other.

A gateway's host is capacity too: :func:`hold_for_gateway` takes an idle instance of an SSH or local fleet for
a gateway (``busy`` with every block, ``gateway_id`` set: no assignment or reclaim takes it while it is held)
and :func:`release_gateway_hold` gives it back.

A run of one job it places may have its status settled in the same transaction (``settle``, a
:class:`~corral.store.plan_result.RunSettler` the caller passes: the runs worker's own decision, so the run goes
``provisioning`` with its job and its event follows the job's). Those runs' rows are taken last, once every gang is
committed or rejected (a rejected gang settles nothing), in id order, and only where no other transaction holds them
(``run_states.lock_run``: ``SKIP LOCKED``, since a user's stop holds the run's row and then asks for its jobs'): the
commit never waits for a run's row, and a run it could not take is left to the runs worker.

No network call happens here. The events of what it commits (jobs placed or failed, instances created,
busy or reclaimed) are written in the same transaction and savepoint, so a rejected gang leaves none.
"""

from __future__ import annotations

import json
import uuid
import zlib
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.costs import placed_price
from corral.domain.durations import shorter_idle
from corral.domain.events import instance_target, job_target, status_change_message
from corral.domain.fleets import nodes_bounds
from corral.domain.gateways import HOST_BACKENDS
from corral.domain.quotas import Limits, Usage
from corral.domain.statuses import READY_INSTANCE, USABLE_INSTANCE
from corral.scheduler.blocks import HOST_GPUS_KEY, pick_host_gpus
from corral.scheduler.codec import offer_to_json
from corral.scheduler.fallbacks import FALLBACKS_KEY
from corral.scheduler.types import Assign, Fail, Gang, Plan, Reclaim, Reserve, Wait
from corral.store import capacity_counts, deferred, direct, prebuilt, transitions
from corral.store import quotas as quota_store
from corral.store.db import Database
from corral.store.events import emit, tracked_update, tracked_update_by_id, tracked_update_row
from corral.store.fleets import live_blocks_on, lock_instance, release_instance
from corral.store.plan_holds import held_for_others
from corral.store.plan_result import ApplyResult, JobLease, RunSettler
from corral.store.quota_count import QuotaCount
from corral.store.snapshot import host_blocks_used, host_gpus_held
from corral.store.tables import fleets, instances, jobs


class _Rejected(Exception):
    pass


#: An instance by ``:_id`` (locked on Postgres), built once (``store/prebuilt.py`` says why).
_INSTANCE = sa.select(instances).where(instances.c.id == sa.bindparam("_id"))
_INSTANCE_LOCKED = _INSTANCE.with_for_update()


async def _assign(
    db: Database, conn: AsyncConnection, d: Assign, now: float, held_for: str | None, lease: dict[str, Any] | None
) -> bool:
    """Place ``d``'s job on its instance; whether ``lease`` (the lease columns) was taken on it with the placement."""
    inst = (await direct.execute(conn, _INSTANCE if db.is_sqlite else _INSTANCE_LOCKED, {"_id": d.instance_id})).first()
    if inst is None or inst.status not in USABLE_INSTANCE or inst.unreachable or inst.deleted:
        raise _Rejected
    if inst.termination_reason is not None:  # on its way out (a host removed from its SSH fleet while busy)
        raise _Rejected
    if inst.gateway_id is not None:  # the host of a gateway (``hold_for_gateway``)
        raise _Rejected
    busy = await live_blocks_on(conn, d.instance_id)
    total = inst.total_blocks or 1
    if busy + d.blocks > total:
        raise _Rejected
    if held_for is not None and d.blocks > total - busy - await held_for_others(conn, d.instance_id, held_for, now):
        raise _Rejected  # the blocks a preemption freed here wait for the run that preempted
    leased = lease is not None and inst.status in READY_INSTANCE and bool(inst.agent)
    status = "busy" if inst.status == "idle" else inst.status
    if not transitions.permit("instances", inst.id, inst.status, status):  # written below, not tracked_update
        raise _Rejected
    price = placed_price(inst.backend, inst.price)
    job = await _take_job(conn, d.job_id, d.instance_id, d.blocks, price, now, lease if leased else None)
    values = {"busy_blocks": busy + d.blocks, "status": status, "last_processed_at": now}
    await direct.execute(
        conn, prebuilt.update_by_id(instances, frozenset(values), None), prebuilt.params(inst.id, values)
    )
    target = instance_target(inst.project_id, inst.id, inst.name, inst.fleet_id)
    if status != inst.status:
        await emit(conn, status_change_message("instance", inst.status, status), None, [target])
    await emit(
        conn,
        f"Job assigned to instance. Instance blocks: {busy + d.blocks}/{total} busy",
        None,
        [_job_target(job), target],
    )
    return leased


def _job_target(job: Any) -> Any:
    return job_target(job.project_id, job.id, job.job_name, job.run_id)


async def _take_job(
    conn: AsyncConnection,
    job_id: str,
    instance_id: str,
    blocks: int,
    price: float,
    now: float,
    lease: dict[str, Any] | None = None,
) -> Any:
    """Place a waiting job on an instance (its status change recorded; ``lease``: the lease columns to set with
    it); the job as it was. A ``submitted`` job is on no instance: every job row starts so, and leaves it for
    good when it is placed or failed. The instance's ``price`` now is stored with it: its cost counts from here."""
    values = {
        "instance_id": instance_id,
        "blocks": blocks,
        "price": price,
        "placed_at": now,
        "status": "provisioning",
        "status_message": None,
        "last_processed_at": now,
        **(lease or {}),
    }
    taken = await tracked_update_row(conn, jobs, job_id, values, expect_status=("submitted",))
    if taken is None:  # another replica placed (or failed) this job meanwhile
        raise _Rejected
    return taken


async def _reserve(
    db: Database, conn: AsyncConnection, d: Reserve, now: float, backend_limits: dict[str, int], pools: dict[str, int]
) -> str:
    fleet = (await conn.execute(db.for_update(sa.select(fleets).where(fleets.c.id == d.fleet_id)))).first()
    if fleet is None or fleet.deleted or fleet.status != "active":
        raise _Rejected
    spec: dict[str, Any] = orjson.loads(fleet.spec)
    nodes_min, nodes_max = nodes_bounds(spec)
    count = await capacity_counts.fleet_instances(conn, d.fleet_id)
    if nodes_max is not None and count >= nodes_max:
        raise _Rejected
    if d.job_id is None and count >= nodes_min:
        raise _Rejected  # upkeep only fills up to nodes.min
    limit = backend_limits.get(d.offer.backend)
    if limit is not None and await capacity_counts.backend_instances(conn, d.offer.backend) >= limit:
        raise _Rejected
    pool = pools.get(d.offer.backend) if d.offer.host_blocks else None
    if pool is not None and await host_blocks_used(conn, d.offer.backend) + d.offer.host_blocks > pool:
        raise _Rejected  # the host it is carved out of has not that many blocks free any more
    offer_json = offer_to_json(d.offer)
    if d.fallbacks:
        offer_json[FALLBACKS_KEY] = [offer_to_json(o) for o in d.fallbacks]
    if d.offer.host_blocks:
        # the carve owns specific GPUs of the host, none that another live instance of it owns
        owned = pick_host_gpus(d.offer, await host_gpus_held(conn, d.offer.backend))
        if owned is None:
            raise _Rejected
        offer_json[HOST_GPUS_KEY] = list(owned)
    num = await capacity_counts.next_instance_num(conn, d.fleet_id)
    instance_id = str(uuid.uuid4())
    conf = spec.get("configuration") or {}
    idle = conf.get("idle_duration")
    idle = float(idle) if isinstance(idle, (int, float)) else None
    if d.job_id is not None:  # an instance created for a run: the shorter of the fleet's and the run's
        idle = shorter_idle(idle, await capacity_counts.run_idle(conn, d.job_id))
    await conn.execute(
        sa.insert(instances).values(
            id=instance_id,
            project_id=fleet.project_id,
            fleet_id=fleet.id,
            name=f"{fleet.name}-{num}",
            instance_num=num,
            status="pending",
            unreachable=False,
            backend=d.offer.backend,
            region=d.offer.region,
            price=d.offer.price,
            offer=json.dumps(offer_json),
            total_blocks=d.total_blocks,
            busy_blocks=d.blocks if d.job_id else 0,
            created_at=now,
            last_processed_at=now,
            idle_duration=idle,
            deleted=False,
        )
    )
    target = instance_target(fleet.project_id, instance_id, f"{fleet.name}-{num}", fleet.id)
    if d.job_id is None:
        await emit(conn, "Instance created to meet target fleet node count. Status: PENDING", None, [target])
        return instance_id
    job = await _take_job(conn, d.job_id, instance_id, d.blocks, placed_price(d.offer.backend, d.offer.price), now)
    await emit(conn, "Instance created for job. Instance status: PENDING", None, [target, _job_target(job)])
    await emit(
        conn,
        f"Job assigned to instance. Instance blocks: {d.blocks}/{d.total_blocks or 1} busy",
        None,
        [_job_target(job), target],
    )
    return instance_id


async def _fail(conn: AsyncConnection, d: Fail, now: float) -> bool:
    done = await tracked_update(
        conn,
        jobs,
        sa.and_(jobs.c.id == d.job_id, jobs.c.status == "submitted", jobs.c.instance_id.is_(None)),
        {
            "status": "failed",
            "status_message": "no capacity",
            "termination_reason": "failed_to_start_due_to_no_capacity",
            "termination_reason_message": d.message,
            "finished_at": now,
            "last_processed_at": now,
        },
    )
    return done > 0


async def _reclaim(db: Database, conn: AsyncConnection, d: Reclaim, now: float) -> bool:
    """Set an instance that is still idle, with no job on it, terminating (``idle_timeout``)."""
    inst = (await conn.execute(db.for_update(sa.select(instances).where(instances.c.id == d.instance_id)))).first()
    if inst is None or inst.status != "idle" or inst.deleted or inst.gateway_id is not None:
        return False
    if await live_blocks_on(conn, d.instance_id):
        return False
    done = await tracked_update(
        conn,
        instances,
        sa.and_(instances.c.id == d.instance_id, instances.c.status == "idle"),
        {
            "status": "terminating",
            "termination_reason": "idle_timeout",
            "termination_reason_message": d.message,
            "last_processed_at": now,
        },
    )
    return done > 0


#: A waiting job's status message, unless it reads so already (built once: ``store/prebuilt.py`` says why).
_WAIT = (
    sa.update(jobs)
    .where(jobs.c.id == sa.bindparam("_id"), jobs.c.status == "submitted")
    .where(sa.or_(jobs.c.status_message.is_(None), jobs.c.status_message != sa.bindparam("_message")))
    .values(status_message=sa.bindparam("_message"))
)


async def _wait(conn: AsyncConnection, d: Wait) -> None:
    await direct.execute(conn, _WAIT, {"_id": d.job_id, "_message": d.message})


async def _apply_gang(  # noqa: C901
    db: Database,
    conn: AsyncConnection,
    gang: Gang,
    now: float,
    backend_caps: dict[str, int],
    pools: dict[str, int],
    result: ApplyResult,
    quotas: dict[str, Limits],
    held: dict[str, Usage],
    holds: bool,
    lease: dict[str, Any] | None,
) -> None:
    """Commit ``gang`` if it still fits (``held``: the holdings of the projects with a quota counted so far in this
    transaction, carried from gang to gang)."""
    assigned: list[str] = []
    leased: list[str] = []
    reserved: list[str] = []
    failed: list[str] = []
    if all(isinstance(d, (Fail, Wait, Reclaim)) for d in gang.decisions):
        # takes no capacity and cannot be rejected: no savepoint (two round trips saved per gang)
        for d in gang.decisions:
            if isinstance(d, Fail):
                if await _fail(conn, d, now):
                    result.failed.append(d.job_id)
            elif isinstance(d, Wait):
                await _wait(conn, d)
            elif isinstance(d, Reclaim) and await _reclaim(db, conn, d, now):
                result.reclaimed.append(d.instance_id)
        return
    limits = quotas.get(gang.project_id) if gang.project_id else None
    # One job on an existing instance needs no savepoint: every check that rejects it comes before its first
    # write (the job's own UPDATE, which writes nothing if the job was taken meanwhile).
    lone = limits is None and len(gang.decisions) == 1 and isinstance(gang.decisions[0], Assign)
    savepoint = None if lone else await conn.begin_nested()
    events_at = deferred.mark(conn)  # the gang's events go with it if it is rejected
    try:
        count = await QuotaCount.start(conn, gang, limits, held)
        for d in gang.decisions:
            if isinstance(d, Assign):
                if await _assign(db, conn, d, now, gang.run_id if holds else None, lease):
                    leased.append(d.job_id)
                assigned.append(d.job_id)
            elif isinstance(d, Reserve):
                reserved.append(await _reserve(db, conn, d, now, backend_caps, pools))
                if d.job_id is not None:
                    assigned.append(d.job_id)
            elif isinstance(d, Fail):
                if await _fail(conn, d, now):
                    failed.append(d.job_id)
            elif isinstance(d, Wait):
                await _wait(conn, d)
        if count is not None and not await count.still_within(conn, held, reserved):
            raise _Rejected  # another commit took the project's quota meanwhile
    except _Rejected:
        if savepoint is not None:
            await savepoint.rollback()
        deferred.drop_since(conn, events_at)
        result.rejected_runs.append(gang.run_id)
        return
    if savepoint is not None:
        await savepoint.commit()
    if count is not None:
        held[count.project_id] = count.after
    result.assigned += assigned
    if lease is not None:
        result.leased.update(dict.fromkeys(leased, lease["lock_token"]))
    result.reserved += reserved
    result.failed += failed


async def apply_plan(
    db: Database,
    plan: Plan,
    now: float,
    backend_limits: dict[str, int] | None = None,
    host_pools: dict[str, int] | None = None,
    holds: bool = False,
    lease: JobLease | None = None,
    settle: RunSettler | None = None,
) -> ApplyResult:
    """Commit what still fits of ``plan``; gangs that no longer fit are listed in ``rejected_runs``.

    ``backend_limits`` caps the instances of a backend; ``host_pools`` the blocks of the host a backend's
    instances are carved out of (the local machine), recounted from the live instances' offers. With
    ``holds`` (preemption is enabled), the blocks a preemption freed are left to the run that preempted
    (``store.plan_holds``). With ``lease``, the jobs placed on a ready instance are leased to its owner in the
    same write (``ApplyResult.leased``). With ``settle``, the status of each run of one job placed is settled by it
    in the same transaction, after every gang (``ApplyResult.settled_runs``: those it settled)."""
    result = ApplyResult()
    if plan.is_empty():
        return result
    limits = backend_limits or {}
    pools = host_pools or {}
    columns = None
    if lease is not None:
        token = str(uuid.uuid4())
        columns = {"lock_owner": lease.owner, "lock_token": token, "lock_expires_at": now + lease.ttl}
    async with db.write() as conn:
        charged = sorted({g.project_id for g in plan.gangs if g.project_id and _takes_capacity(g)})
        quotas = await quota_store.quota_maxes(conn, charged) if charged else {}
        for project_id in sorted(quotas):
            await db.serialize(conn, project_lock_key(project_id))
        for backend in _capped_backends(plan, limits, pools):
            await db.serialize(conn, backend_lock_key(backend))
        await _lock_rows(db, conn, plan)
        held: dict[str, Usage] = {}
        for gang in plan.gangs:
            await _apply_gang(db, conn, gang, now, limits, pools, result, quotas, held, holds, columns)
        if settle is not None:
            for run_id in _placed_alone(plan, result):
                if await settle(conn, run_id, now):
                    result.settled_runs.add(run_id)
    return result


def _placed_alone(plan: Plan, result: ApplyResult) -> list[str]:
    """The runs whose gang placed one job and was committed, sorted (the order their rows are taken in)."""
    placed = set(result.assigned)
    rejected = set(result.rejected_runs)
    found: set[str] = set()
    for gang in plan.gangs:
        jobs_ = [d.job_id for d in gang.decisions if isinstance(d, (Assign, Reserve)) and d.job_id is not None]
        if len(jobs_) == 1 and jobs_[0] in placed and gang.run_id not in rejected:
            found.add(gang.run_id)
    return sorted(found)


async def _lock_rows(db: Database, conn: AsyncConnection, plan: Plan) -> None:
    """Lock the fleet rows the plan reserves in and the instance rows it assigns to or reclaims, each kind
    sorted, before any gang takes them (nothing on SQLite, whose write transaction excludes every writer)."""
    if db.is_sqlite:
        return
    decisions = [d for gang in plan.gangs for d in gang.decisions]
    fleet_ids = sorted({d.fleet_id for d in decisions if isinstance(d, Reserve)})
    instance_ids = sorted({d.instance_id for d in decisions if isinstance(d, (Assign, Reclaim))})
    if fleet_ids:
        await conn.execute(
            db.for_update(sa.select(fleets.c.id).where(fleets.c.id.in_(fleet_ids)).order_by(fleets.c.id))
        )
    for instance_id in instance_ids:
        await lock_instance(conn, instance_id)


def _takes_capacity(gang: Gang) -> bool:
    return any(isinstance(d, (Assign, Reserve)) for d in gang.decisions)


def project_lock_key(project_id: str) -> int:
    """The advisory lock under which a project's holding is counted against its ``quota.max``."""
    return 0x636F7272_00000000 | zlib.crc32(f"quota:{project_id}".encode())


def backend_lock_key(backend: str) -> int:
    """The advisory lock under which instances of ``backend`` are counted against a cap shared by every
    fleet (its instance limit, its host's blocks and GPUs): fleet row locks alone would let two replicas
    reserving in different fleets both fit the last block."""
    return 0x636F7272_00000000 | zlib.crc32(f"backend:{backend}".encode())


def _capped_backends(plan: Plan, limits: dict[str, int], pools: dict[str, int]) -> list[str]:
    """The backends whose shared caps this plan's reservations are counted against, sorted: taken first
    and in one order, before any row lock, so that concurrent commits cannot deadlock on them."""
    found = {
        d.offer.backend
        for gang in plan.gangs
        for d in gang.decisions
        if isinstance(d, Reserve) and (d.offer.backend in limits or (d.offer.host_blocks and d.offer.backend in pools))
    }
    return sorted(found)


@dataclass(frozen=True)
class GatewayHost:
    """The instance a gateway is held on: its id, name and address, and how its agent is reached."""

    instance_id: str
    name: str
    hostname: str | None
    agent: dict[str, Any] | None


async def hold_for_gateway(
    db: Database, conn: AsyncConnection, fleet_id: str, gateway_id: str, taken_hosts: set[str], now: float
) -> GatewayHost | None:
    """Hold an idle instance of the fleet ``fleet_id`` for the gateway ``gateway_id``, in ``conn``'s write
    transaction: ``busy`` with every block, ``gateway_id`` set, so that the scheduler sees it full and the commit
    point refuses to place a job on it or reclaim it. Only an SSH host or a local instance (this machine) is taken
    (``HOST_BACKENDS``); an instance on its way out, unreachable, with a job on it, or at an address in
    ``taken_hosts`` (another gateway's host: every local instance has this machine's) is not. None when no instance
    is left."""
    q = (
        sa.select(instances)
        .where(
            instances.c.fleet_id == fleet_id,
            instances.c.backend.in_(HOST_BACKENDS),
            instances.c.status == "idle",
            instances.c.deleted == sa.false(),
            instances.c.gateway_id.is_(None),
            instances.c.termination_reason.is_(None),
            instances.c.unreachable == sa.false(),
        )
        .order_by(instances.c.instance_num)
    )
    for inst in (await conn.execute(db.for_update(q))).all():
        if inst.hostname in taken_hosts or await live_blocks_on(conn, inst.id):
            continue
        total = inst.total_blocks or 1
        values = {"gateway_id": gateway_id, "busy_blocks": total, "status": "busy", "last_processed_at": now}
        if not await tracked_update_by_id(conn, instances, inst.id, values, ("idle",)):
            continue
        target = instance_target(inst.project_id, inst.id, inst.name, inst.fleet_id)
        await emit(conn, f"Instance held for a gateway. Instance blocks: {total}/{total} busy", None, [target])
        return GatewayHost(inst.id, inst.name, inst.hostname, orjson.loads(inst.agent) if inst.agent else None)
    return None


async def release_gateway_hold(conn: AsyncConnection, instance_id: str, gateway_id: str, now: float) -> bool:
    """Give back the instance held for ``gateway_id`` (idle again when no job is on it); whether it was held."""
    await lock_instance(conn, instance_id)
    res = await conn.execute(
        sa.update(instances)
        .where(instances.c.id == instance_id, instances.c.gateway_id == gateway_id)
        .values(gateway_id=None)
    )
    if not res.rowcount:
        return False
    await release_instance(conn, instance_id, now)
    return True
