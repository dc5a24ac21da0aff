"""Preemption's reads and writes: the jobs that hold capacity as the pure decision sees them
(``scheduler.preemption.RunningJob``), the victims' stop, recorded with an event per gang, and the
preempted jobs that have ended lately (``scheduler.holds.Ended``: the capacity held for their preemptor). The stop
itself goes the usual way: ``stop_requested = "preempted"``, which the job's follower sends to its agent
with the grace period (``workers.jobs``).

Imports only SQLAlchemy, the tables, the quotas store and ``corral.domain``/``corral.scheduler`` types.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.events import run_target
from corral.domain.quotas import charge
from corral.domain.statuses import ACTIVE_JOB, HOLDING_JOB, UNFINISHED_JOB
from corral.scheduler.holds import Ended
from corral.scheduler.preemption import Preemption, RunningJob
from corral.store.events import emit
from corral.store.quotas import offer_parts
from corral.store.tables import PREEMPTED_SQL, instances, jobs, runs

#: ``jobs.stop_requested`` of a job stopped to make room for another run.
PREEMPTED = "preempted"
#: The advisory lock under which victims are stopped (taken before any row lock, by nothing else).
STOP_LOCK_KEY = 0x636F7272_00000000 | zlib.crc32(b"preemption:stop")


async def holding_jobs(conn: AsyncConnection, run_types: Mapping[str, str]) -> tuple[list[RunningJob], dict[str, str]]:
    """The jobs on an instance that hold capacity, and the run types of the runs not in ``run_types`` yet."""
    q = (
        sa.select(
            jobs.c.id,
            jobs.c.run_id,
            jobs.c.run_name,
            jobs.c.project_id,
            jobs.c.priority,
            jobs.c.replica_num,
            jobs.c.submitted_at,
            jobs.c.ssh_seen_at,
            jobs.c.status,
            jobs.c.stop_requested,
            jobs.c.termination_reason_message,
            jobs.c.blocks,
            jobs.c.instance_id,
            instances.c.offer,
            instances.c.price,
            instances.c.total_blocks,
        )
        .join(instances, instances.c.id == jobs.c.instance_id)
        .where(jobs.c.status.in_(HOLDING_JOB))
    )
    rows = (await conn.execute(q)).all()
    unknown = sorted({r.run_id for r in rows} - set(run_types))
    types: dict[str, str] = {}
    for start in range(0, len(unknown), 500):
        chunk = unknown[start : start + 500]
        for run_id, run_spec in await conn.execute(sa.select(runs.c.id, runs.c.run_spec).where(runs.c.id.in_(chunk))):
            spec: Any = orjson.loads(run_spec) if run_spec else {}
            types[run_id] = str((spec.get("configuration") or {}).get("type") or "task")
    known = {**run_types, **types}
    out = []
    for r in rows:
        gpus, cpus, mem = offer_parts(r.offer)
        usage = charge(gpus, cpus, mem, float(r.price or 0.0), int(r.blocks or 1), int(r.total_blocks or 1))
        out.append(
            RunningJob(
                id=r.id,
                run_id=r.run_id,
                run_name=r.run_name,
                project_id=r.project_id,
                priority=int(r.priority or 0),
                # a job starts when it reaches its host (``ssh_seen_at`` is set then); until then: now-ish
                started_at=float(r.ssh_seen_at if r.ssh_seen_at is not None else r.submitted_at),
                run_type=known.get(r.run_id, "task"),
                instance_id=r.instance_id,
                blocks=int(r.blocks or 1),
                usage=usage,
                replica_num=int(r.replica_num or 0),
                stopping=r.stop_requested is not None or r.status == "terminating",
                preempted_for=r.termination_reason_message if r.stop_requested == PREEMPTED else None,
            )
        )
    return out, types


async def busy_blocks(conn: AsyncConnection) -> dict[str, int]:
    """Each instance's busy blocks now (``instances.busy_blocks``, recounted whenever a job lets go)."""
    q = sa.select(instances.c.id, instances.c.busy_blocks).where(instances.c.deleted == sa.false())
    return {r.id: int(r.busy_blocks or 0) for r in await conn.execute(q)}


async def stop_victims(conn: AsyncConnection, chosen: Sequence[Preemption], now: float) -> list[Preemption]:
    """Ask every job of each chosen gang to stop, preempted; an event per gang. Returns the gangs stopped.

    The decision was made on a snapshot, so it is checked again here, rows locked: a gang is stopped only
    if none of its jobs was asked to stop meanwhile, its preemptor still waits, and no gang is already
    stopping for that preemptor (another server replica acted first on the same queue). Replicas stop
    victims one after the other (an advisory lock on Postgres; SQLite's write transaction is exclusive):
    the last check reads what other transactions stopped, and two replicas stopping different gangs for
    one preemptor at once would each find none stopping yet."""
    if not chosen:
        return []
    if conn.dialect.name == "postgresql":
        await conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": STOP_LOCK_KEY})
    stopping = sa.select(jobs.c.termination_reason_message).where(
        jobs.c.stop_requested == PREEMPTED, jobs.c.status.in_(HOLDING_JOB)
    )
    busy_for = {m for (m,) in await conn.execute(stopping)}
    waiting = sa.select(jobs.c.run_id).where(
        jobs.c.run_id.in_(sorted({p.preemptor_run_id for p in chosen})),
        jobs.c.status == "submitted",
        jobs.c.instance_id.is_(None),
    )
    still_waiting = {r for (r,) in await conn.execute(waiting)}
    done = []
    for p in chosen:
        if p.preemptor_run_id not in still_waiting or p.message in busy_for:
            continue
        free = sa.and_(jobs.c.id.in_(list(p.job_ids)), jobs.c.stop_requested.is_(None), jobs.c.status.in_(ACTIVE_JOB))
        rows = (await conn.execute(sa.select(jobs.c.id, jobs.c.project_id).where(free).with_for_update())).all()
        if len(rows) != len(p.job_ids):
            continue
        await conn.execute(
            sa.update(jobs)
            .where(free)
            .values(stop_requested=PREEMPTED, termination_reason_message=p.message, last_processed_at=now)
        )
        why = "within its project" if p.rule == "within_project" else "its project reclaiming its quota"
        target = run_target(rows[0].project_id, p.run_id, p.run_name)
        await emit(conn, f"Run preempted by run {p.preemptor_run_name} ({why})", None, [target])
        done.append(p)
    return done


#: The preempted jobs that ended at ``:since`` or later (built once); the predicate of ix_jobs_preempted comes
#: first, spelled as it is, so that the victims alone are read.
ENDED_VICTIMS = sa.select(
    jobs.c.instance_id, jobs.c.blocks, jobs.c.project_id, jobs.c.termination_reason_message, jobs.c.finished_at
).where(
    sa.text(f"jobs.{PREEMPTED_SQL}"),
    jobs.c.status.notin_(UNFINISHED_JOB),
    jobs.c.finished_at >= sa.bindparam("since"),
    jobs.c.instance_id.is_not(None),
)


async def ended_victims(conn: AsyncConnection, since: float) -> list[Ended]:
    """The preempted jobs that ended at ``since`` or later, with the instance blocks they gave back."""
    return [
        Ended(r.instance_id, int(r.blocks or 1), r.project_id, r.termination_reason_message or "", float(r.finished_at))
        for r in await conn.execute(ENDED_VICTIMS, {"since": since})
    ]
