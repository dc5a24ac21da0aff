"""Projects' scheduling policies (the ``project_quotas`` table) and what each project holds: the usage
of its provisioning, pulling, running and still-stopping jobs, charged per GPU model from the offer of
the instance each job is on, and the capacity of the fleets it can use (its own and those exported to it).

Imports only SQLAlchemy, the tables, the exports store and ``corral.domain``.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.quotas import Limits, QuotaPolicy, Usage, add, charge, limits_from_doc, limits_to_doc
from corral.domain.statuses import HOLDING_JOB
from corral.store import direct
from corral.store import exports as export_store
from corral.store.tables import fleets, instances, jobs, project_quotas

#: The job statuses that hold capacity against a quota (a stopping job still holds what it is on).
HOLDING_STATUSES = HOLDING_JOB


def _policy(text: str) -> QuotaPolicy:
    doc = orjson.loads(text)
    return QuotaPolicy(
        weight=float(doc.get("weight", 1.0)),
        nominal=limits_from_doc(doc.get("nominal")),
        max=limits_from_doc(doc.get("max")),
        preemptible_max_priority=doc.get("preemptible_max_priority"),
        preemptible_run_types=tuple(doc.get("preemptible_run_types") or ()),
    )


def _policy_json(policy: QuotaPolicy) -> str:
    return orjson.dumps(
        {
            "weight": policy.weight,
            "nominal": limits_to_doc(policy.nominal),
            "max": limits_to_doc(policy.max),
            "preemptible_max_priority": policy.preemptible_max_priority,
            "preemptible_run_types": list(policy.preemptible_run_types),
        }
    ).decode()


#: A project's quota policy (``:_id``), built once (``store/prebuilt.py`` says why): every run's apply reads it.
_POLICY = sa.select(project_quotas.c.policy).where(project_quotas.c.project_id == sa.bindparam("_id"))


async def get_policy(conn: AsyncConnection, project_id: str) -> QuotaPolicy | None:
    row = (await direct.execute(conn, _POLICY, {"_id": project_id})).first()
    return _policy(row.policy) if row is not None else None


#: Every project's quota policy, and those of ``:ids`` (built once: ``store/prebuilt.py`` says why).
_POLICIES = sa.select(project_quotas.c.project_id, project_quotas.c.policy)
_POLICIES_OF = _POLICIES.where(project_quotas.c.project_id.in_(sa.bindparam("ids", expanding=True)))


async def all_policies(conn: AsyncConnection, project_ids: Collection[str] | None = None) -> dict[str, QuotaPolicy]:
    if project_ids is None:
        rows = await direct.execute(conn, _POLICIES)
    else:
        rows = await conn.execute(_POLICIES_OF, {"ids": list(project_ids)})
    return {r.project_id: _policy(r.policy) for r in rows}


async def set_policy(conn: AsyncConnection, project_id: str, policy: QuotaPolicy) -> None:
    """Replace the project's policy (a default policy is stored as no row: no limits)."""
    await conn.execute(sa.delete(project_quotas).where(project_quotas.c.project_id == project_id))
    if not policy.is_default():
        await conn.execute(
            sa.insert(project_quotas).values(project_id=project_id, policy=_policy_json(policy), updated_at=time.time())
        )


def _loads(value: Any) -> Any:
    return orjson.loads(value) if isinstance(value, (str, bytes)) else value


def offer_parts(offer: Any) -> tuple[list[str], int, int]:
    data = _loads(offer)
    res = data.get("resources") if isinstance(data, dict) else None
    if not isinstance(res, dict):
        return [], 0, 0
    gpus = [str(g.get("name", "")) for g in res.get("gpus") or () if isinstance(g, dict)]
    return gpus, int(res.get("cpus") or 0), int(res.get("memory_mib") or 0)


@dataclass(frozen=True)
class Holding:
    """What a project's holding jobs hold, and the instances they are on."""

    usage: Usage
    instance_ids: frozenset[str]


#: The holding jobs grouped by project, instance and blocks taken: a row per busy instance, not per job (with
#: thousands of hosts a scheduling pass reads this on every pass while a quota or share is set).
_HOLDING = (
    sa.select(
        jobs.c.project_id,
        jobs.c.blocks,
        sa.func.count().label("jobs"),
        instances.c.id.label("instance_id"),
        instances.c.offer,
        instances.c.price,
        instances.c.total_blocks,
    )
    .join(instances, instances.c.id == jobs.c.instance_id)
    .where(jobs.c.status.in_(HOLDING_STATUSES))
    # the instance's columns depend on its id (its primary key): Postgres takes them ungrouped, as SQLite does
    .group_by(jobs.c.project_id, instances.c.id, jobs.c.blocks)
)


#: What the holding jobs of one project hold on one instance: (instance id, project id, usage).
HeldOn = tuple[str, str, Usage]


async def held_on_instances(conn: AsyncConnection, where: Any = None) -> list[HeldOn]:
    """What each project's holding jobs hold on each instance (``where``: a condition the rows must also meet),
    no instance count."""
    out: dict[tuple[str, str], Usage] = {}
    charged: dict[tuple[Any, ...], Usage] = {}  # hosts alike are charged alike: each offer parsed once
    for r in await conn.execute(_HOLDING if where is None else _HOLDING.where(where)):
        key = (r.offer, r.price, r.blocks, r.total_blocks)
        held = charged.get(key)
        if held is None:
            gpus, cpus, mem = offer_parts(r.offer)
            held = charged[key] = charge(
                gpus, cpus, mem, float(r.price or 0.0), int(r.blocks or 1), int(r.total_blocks or 1)
            )
        usage = out.setdefault((r.instance_id, r.project_id), {})
        for dim, amount in held.items():
            usage[dim] = usage.get(dim, 0.0) + amount * r.jobs
    return [(iid, pid, usage) for (iid, pid), usage in out.items()]


def holdings_of(held: Iterable[HeldOn]) -> dict[str, Holding]:
    """project id -> what it holds in all (``instances``: the number of instances it holds jobs on)."""
    out: dict[str, Usage] = {}
    on: dict[str, set[str]] = {}
    for instance_id, project_id, usage in held:
        total = out.setdefault(project_id, {})
        for dim, amount in usage.items():
            total[dim] = total.get(dim, 0.0) + amount
        on.setdefault(project_id, set()).add(instance_id)
    for pid, ids in on.items():
        out[pid]["instances"] = float(len(ids))
    return {pid: Holding(usage, frozenset(on[pid])) for pid, usage in out.items()}


async def project_holdings(conn: AsyncConnection, project_ids: Collection[str] | None = None) -> dict[str, Holding]:
    """project id -> what its holding jobs hold (``instances``: the number of instances they are on)."""
    where = None if project_ids is None else jobs.c.project_id.in_(list(project_ids))
    return holdings_of(await held_on_instances(conn, where))


async def project_usage(conn: AsyncConnection, project_ids: Collection[str] | None = None) -> dict[str, Usage]:
    """project id -> what its holding jobs hold."""
    return {pid: h.usage for pid, h in (await project_holdings(conn, project_ids)).items()}


async def quota_maxes(conn: AsyncConnection, project_ids: Collection[str] | None = None) -> dict[str, Limits]:
    """project id -> its ``quota.max``, for the projects that have one (of ``project_ids``, if given). Every
    policy is read (a row per project with one: a short table), by a statement sent as compiled."""
    wanted = None if project_ids is None else set(project_ids)
    return {
        pid: p.max
        for pid, p in (await all_policies(conn)).items()
        if not p.max.is_empty() and (wanted is None or pid in wanted)
    }


@dataclass(frozen=True)
class Pool:
    """The fleets a project can use, what their instances have in all, and the projects sharing them."""

    capacity: Usage
    projects: frozenset[str]


async def project_pool(conn: AsyncConnection, project_id: str) -> Pool:
    importers = await export_store.fleet_importers(conn)
    rows = (await conn.execute(sa.select(fleets.c.id, fleets.c.project_id).where(fleets.c.deleted == sa.false()))).all()
    mine = [r for r in rows if r.project_id == project_id or project_id in importers.get(r.id, frozenset())]
    sharing = {project_id}
    for r in mine:
        sharing.add(r.project_id)
        sharing |= importers.get(r.id, frozenset())
    capacity: Usage = {}
    if mine:
        iq = sa.select(instances.c.offer, instances.c.price).where(
            instances.c.fleet_id.in_([r.id for r in mine]),
            instances.c.status != "terminated",
            instances.c.deleted == sa.false(),
        )
        for inst in await conn.execute(iq):
            gpus, cpus, mem = offer_parts(inst.offer)
            capacity = add(capacity, charge(gpus, cpus, mem, float(inst.price or 0.0), 1, 1))
            capacity["instances"] = capacity.get("instances", 0.0) + 1
    return Pool(capacity, frozenset(sharing))


async def waiting_projects(conn: AsyncConnection, project_ids: Collection[str]) -> set[str]:
    """The projects among ``project_ids`` with a job waiting to be placed."""
    q = (
        sa.select(jobs.c.project_id)
        .where(jobs.c.status == "submitted", jobs.c.instance_id.is_(None), jobs.c.project_id.in_(list(project_ids)))
        .distinct()
    )
    return {r.project_id for r in await conn.execute(q)}


__all__ = [
    "HOLDING_STATUSES",
    "Holding",
    "Limits",
    "Pool",
    "all_policies",
    "get_policy",
    "project_holdings",
    "project_pool",
    "project_usage",
    "quota_maxes",
    "set_policy",
    "waiting_projects",
]
