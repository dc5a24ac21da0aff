"""What becomes of an instance, and of the jobs bound to it, when its provisioning or termination ends or its
cloud takes it away: the writes of the instances and interruptions workers, each in the caller's transaction.

A write made under the instance's lease (``store/leases.py``) is guarded by its token and clears the lease as
it lands, so a stale worker writes nothing. Status changes are recorded as events (``tracked_update``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.statuses import READY_INSTANCE, STOPPABLE_JOB
from corral.store import leases
from corral.store.events import tracked_update
from corral.store.fleets import LIVE_JOB_STATUSES, dump, live_blocks_on, lock_instance
from corral.store.tables import LEASED_SQL, fleets, instances, jobs

#: The lease columns cleared by a write that ends the lease.
_NO_LEASE = {"lock_owner": None, "lock_token": None, "lock_expires_at": None}
#: What an instance whose machine is gone is marked with its ``terminated`` (see :func:`record_terminated`).
_GONE = {"deleted": True}
#: Jobs on a lost instance that end ``interrupted_by_no_capacity`` (those already stopping just end).
_INTERRUPTED = STOPPABLE_JOB


@dataclass(frozen=True)
class ProvisionedInstance:
    """What provisioning found, as the instance's row keeps it."""

    #: The agent's endpoint (JSON), its token already sealed.
    agent: dict[str, Any]
    hostname: str | None
    #: The offer launched (JSON), with the resources found.
    offer: dict[str, Any]
    total_blocks: int | None
    region: str | None
    price: float
    #: What the jobs placed on it are charged now, when that is not what they were placed at (a cloud launched
    #: a fallback offer of another price); None: as placed.
    jobs_price: float | None = None
    #: What the backend says of the instance (a Slurm allocation's node and time limit); None: nothing.
    status_message: str | None = None


async def record_provisioned(
    conn: AsyncConnection, instance_id: str, token: str, found: ProvisionedInstance, now: float
) -> bool:
    """Record a provisioned instance (``idle``, or ``busy`` with the blocks its unfinished jobs hold) while its
    lease ``token`` holds and it is still ``pending``; whether it was recorded (not: the lease was lost, or the
    instance is being terminated meanwhile)."""
    await lock_instance(conn, instance_id)  # a job's end committed meanwhile is counted, not overwritten
    busy = await live_blocks_on(conn, instance_id)
    updated = await tracked_update(
        conn,
        instances,
        sa.and_(leases.guard(instances, instance_id, token), instances.c.status == "pending"),
        {
            "status": "busy" if busy else "idle",
            "busy_blocks": busy,
            "agent": dump(found.agent),
            "hostname": found.hostname,
            "offer": dump(found.offer),
            "started_at": now,
            "last_processed_at": now,
            "last_job_finished_at": None if busy else now,
            "total_blocks": found.total_blocks,
            "region": found.region,
            "price": found.price,
            "status_message": found.status_message,
            **_NO_LEASE,
        },
    )
    if updated:  # the fleet's last failure is past
        await _fleet_message(conn, instance_id, None)
    if updated and found.jobs_price is not None:
        await conn.execute(
            sa.update(jobs)
            .where(jobs.c.instance_id == instance_id, jobs.c.status == "provisioning")
            .values(price=found.jobs_price)
        )
    return updated > 0


async def _fleet_message(conn: AsyncConnection, instance_id: str, message: str | None) -> None:
    """The ``status_message`` of the instance's fleet (while it is active): why its last instance could not
    be provisioned, or None once one was."""
    fleet_id = (await conn.execute(sa.select(instances.c.fleet_id).where(instances.c.id == instance_id))).scalar()
    if fleet_id is not None:
        await conn.execute(
            sa.update(fleets)
            .where(
                fleets.c.id == fleet_id, fleets.c.status == "active", fleets.c.status_message.is_distinct_from(message)
            )
            .values(status_message=message)
        )


async def record_provisioning_failed(
    conn: AsyncConnection,
    instance_id: str,
    token: str,
    instance_name: str,
    message: str,
    reason: tuple[str, str],
    now: float,
) -> None:
    """The instance (under its lease ``token``) is terminated with ``message``, and the jobs waiting for it fail
    with ``reason``: their termination reason and status message (``no capacity``, ``quota reached``...).

    A cloud's or the local backend's instance is marked ``deleted`` too: dstack 0.22.5 deletes a job's placeholder
    instance that could not be provisioned, and a fleet's, left ``terminated``, at the fleet's next consolidation
    (``_maintain_fleet_nodes_in_min_max_range``, ``server/background/pipeline_tasks/fleets.py``); why it failed
    stays in the fleet's ``status_message``. An SSH fleet's host is kept, listed with its error until the fleet is
    applied again (dstack consolidates no SSH fleet)."""
    termination_reason, status_message = reason
    await _fleet_message(conn, instance_id, f"Instance {instance_name} could not be provisioned: {message}")
    backend = (await conn.execute(sa.select(instances.c.backend).where(instances.c.id == instance_id))).scalar()
    await tracked_update(
        conn,
        instances,
        leases.guard(instances, instance_id, token),
        {
            "status": "terminated",
            "deleted": backend != "ssh",
            "termination_reason": "error",
            "termination_reason_message": message,
            "finished_at": now,
            "last_processed_at": now,
            **_NO_LEASE,
        },
    )
    await tracked_update(
        conn,
        jobs,
        sa.and_(jobs.c.instance_id == instance_id, jobs.c.status.in_(("provisioning", "submitted"))),
        {
            "status": "failed",
            "termination_reason": termination_reason,
            "termination_reason_message": f"Failed to provision instance {instance_name}: {message}",
            "status_message": status_message,
            "finished_at": now,
            "last_processed_at": now,
        },
    )


async def record_terminated(
    conn: AsyncConnection, instance_id: str, token: str, instance_name: str, now: float
) -> None:
    """The backend confirmed the instance (under its lease ``token``) terminated: so is it, holding no blocks, and
    so are the jobs still bound to it (they cannot go on). It is marked ``deleted`` in the same write, as dstack
    0.22.5 marks an instance when its ``terminate_instance`` returns (``deleted``, ``deleted_at`` and
    ``finished_at`` with the status: ``server/background/pipeline_tasks/instances/termination.py``): history
    from then on, listed by ``instances/list`` but no longer by its fleet, and out of the live instances' indexes."""
    await tracked_update(
        conn,
        instances,
        leases.guard(instances, instance_id, token),
        {"status": "terminated", **_GONE, "finished_at": now, "last_processed_at": now, "busy_blocks": 0, **_NO_LEASE},
    )
    await tracked_update(
        conn,
        jobs,
        sa.and_(jobs.c.instance_id == instance_id, jobs.c.status.in_(LIVE_JOB_STATUSES)),
        {
            "status": "terminated",
            "termination_reason": "terminated_by_server",
            "termination_reason_message": f"Instance {instance_name} was terminated",
            "finished_at": now,
        },
    )


async def record_lost(conn: AsyncConnection, instance_id: str, message: str, now: float) -> bool:
    """The cloud took the instance away (a spot interruption): while it is ``idle`` or ``busy`` it is terminated
    with ``message`` and marked ``deleted`` (its machine is gone, as after :func:`record_terminated`), its running
    jobs fail ``interrupted_by_no_capacity`` and its stopping ones end. Whether it was recorded (not: corral is
    terminating it meanwhile, or it is gone already)."""
    changed = await tracked_update(
        conn,
        instances,
        sa.and_(instances.c.id == instance_id, instances.c.status.in_(READY_INSTANCE)),
        {
            "status": "terminated",
            **_GONE,
            "termination_reason": "error",
            "termination_reason_message": message,
            "finished_at": now,
            "last_processed_at": now,
            "busy_blocks": 0,
        },
    )
    if changed:
        await _end_jobs_on(conn, instance_id, "interrupted_by_no_capacity", message, now)
    return bool(changed)


async def record_unreachable(conn: AsyncConnection, instance_id: str, message: str, now: float) -> bool:
    """Its agent stayed lost past its backend's bound and the backend can replace it: while it is ``idle`` or
    ``busy`` the instance goes ``terminating`` (reason ``unreachable``, holding no blocks: the instances worker
    ends it, and the slot it holds in its fleet is free once it is gone), its running jobs fail
    ``instance_unreachable`` (their ``retry`` decides what comes next) and its stopping ones end. Whether it
    was recorded (not: it is being terminated already, or gone)."""
    changed = await tracked_update(
        conn,
        instances,
        sa.and_(instances.c.id == instance_id, instances.c.status.in_(READY_INSTANCE)),
        {
            "status": "terminating",
            "termination_reason": "unreachable",
            "termination_reason_message": message,
            "last_processed_at": now,
            "busy_blocks": 0,
        },
    )
    if changed:
        await _end_jobs_on(conn, instance_id, "instance_unreachable", message, now)
    return bool(changed)


async def _end_jobs_on(conn: AsyncConnection, instance_id: str, reason: str, message: str, now: float) -> None:
    """The jobs of an instance that is gone (or given up): running ones fail with ``reason``, stopping ones end."""
    await tracked_update(
        conn,
        jobs,
        sa.and_(jobs.c.instance_id == instance_id, jobs.c.status.in_(_INTERRUPTED)),
        {
            "status": "failed",
            "termination_reason": reason,
            "termination_reason_message": message,
            "finished_at": now,
            "last_processed_at": now,
        },
    )
    await tracked_update(
        conn,
        jobs,
        sa.and_(jobs.c.instance_id == instance_id, jobs.c.status == "terminating"),
        {"status": "terminated", "finished_at": now, "last_processed_at": now},
    )


#: Only the rows that hold a lease are written (every job ever was rewritten at each start: seconds, and the WAL
#: as large as the table, with a year of history); a job's from the leased jobs' own partial index.
DROP_INSTANCE_LEASES = sa.update(instances).where(instances.c.lock_owner.is_not(None)).values(**_NO_LEASE)
DROP_JOB_LEASES = sa.update(jobs).where(sa.text(f"jobs.{LEASED_SQL}")).values(**_NO_LEASE)


async def drop_all_leases(conn: AsyncConnection) -> None:
    """Every instance's and job's lease is dropped: at start-up on SQLite, where this process is the only server,
    so a lease held by a previous one died with it."""
    await conn.execute(DROP_INSTANCE_LEASES)
    await conn.execute(DROP_JOB_LEASES)
