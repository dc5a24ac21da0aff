"""Per-project quotas and the scheduling queue, as the API serves them: a project's policy (``quotas/set``
by a global admin, replacing the policy whole; ``quotas/get`` by any member), its usage against it
(``quotas/usage``: nominal, max, used, borrowed, entitlement, weighted share) and the waiting runs in the
order the scheduler takes them, with why each waits (``scheduling/queue``). The server's ``config.yml``
re-applies the policies it gives at each start (:func:`apply_config_policies`).
"""

from __future__ import annotations

from typing import Any

from corral.context import Context
from corral.domain import quotas as q
from corral.domain.records import ProjectRec, UserRec
from corral.scheduler.quota_gate import QUOTA_WAIT_PREFIX
from corral.services.errors import Forbidden, ServiceError, validation_errors
from corral.store import accounts as account_store
from corral.store import quotas as store
from corral.store import snapshot as snapshot_store
from corral.store.db import Database

#: Why a run waits, as ``scheduling/queue`` names it.
REASONS = ("quota", "capacity", "fair_share", "gang")


def policy_json(project: ProjectRec, policy: q.QuotaPolicy | None) -> dict[str, Any]:
    from corral.config.quotas import policy_doc

    return {"name": project.name, **policy_doc(policy or q.QuotaPolicy())}


def parse_policy_body(body: Any) -> q.QuotaPolicy:
    """The body of ``quotas/set`` as a policy, or a 400 naming each field that is wrong."""
    from pydantic import ValidationError

    from corral.config.quotas import parse_policy

    if isinstance(body, dict) and "name" in body:
        body = {k: v for k, v in body.items() if k != "name"}
    try:
        return parse_policy(body)
    except ValidationError as e:
        raise validation_errors(e, ()) from None


def require_global_admin(user: UserRec) -> None:
    if user.global_role != "admin":
        raise Forbidden()


async def set_policy(ctx: Context, project: ProjectRec, user: UserRec, body: Any) -> dict[str, Any]:
    require_global_admin(user)
    if isinstance(body, dict) and body.get("name") not in (None, project.name):
        raise ServiceError(f"name: the body names project {body.get('name')!r} but the path names {project.name!r}")
    policy = parse_policy_body(body)
    async with ctx.db.write() as conn:
        await store.set_policy(conn, project.id, policy)
    return policy_json(project, policy)


async def get_policy(ctx: Context, project: ProjectRec) -> dict[str, Any]:
    async with ctx.db.read() as conn:
        return policy_json(project, await store.get_policy(conn, project.id))


async def usage(ctx: Context, project: ProjectRec) -> dict[str, Any]:
    return await _usage(ctx, project.id, project.name)


async def _usage(ctx: Context, project_id: str, project_name: str) -> dict[str, Any]:
    async with ctx.db.read() as conn:
        pool = await store.project_pool(conn, project_id)
        policies = await store.all_policies(conn, pool.projects)
        used_all = await store.project_usage(conn, pool.projects)
        waiting = await store.waiting_projects(conn, pool.projects)
    policy = policies.get(project_id, q.QuotaPolicy())
    used = used_all.get(project_id, {})
    active = {p for p in pool.projects if used_all.get(p) or p in waiting}
    return {
        "project_name": project_name,
        "weight": policy.weight,
        "nominal": q.limits_to_doc(policy.nominal),
        "max": q.limits_to_doc(policy.max),
        "used": q.usage_doc(used),
        "borrowed": q.usage_doc(q.borrowed(used, policy.nominal)),
        "entitlement": q.usage_doc(q.entitlement(project_id, policies, pool.capacity, active)),
        "weighted_share": round(q.weighted_share(used, policy, pool.capacity), 6),
        "capacity": q.usage_doc(pool.capacity),
    }


def wait_reason(message: str | None) -> str:
    """Why a job waits, from the message the scheduler gave it."""
    text = message or ""
    if text.startswith(QUOTA_WAIT_PREFIX):
        return "quota"
    if "fair share" in text:
        return "fair_share"
    if "nodes at once" in text:
        return "gang"
    return "capacity"


async def queue(ctx: Context, user: UserRec) -> list[dict[str, Any]]:
    """The waiting runs the caller may see (every project's for a global admin, else its projects'), in the
    scheduler's order (priority, higher first; then submission time), one entry per run."""
    async with ctx.db.read() as conn:
        mine = None
        if user.global_role != "admin":
            mine = [p.id for p in await account_store.list_projects(conn, user.id)]
        rows = await snapshot_store.waiting_jobs(conn, mine)
    out: list[dict[str, Any]] = []
    seen: dict[str, dict[str, Any]] = {}
    for r in rows:
        entry = seen.get(r.run_id)
        if entry is None:
            entry = {
                "project_name": r.project_name,
                "run_name": r.run_name,
                "priority": r.priority,
                "submitted_at": r.submitted_at,
                "jobs": 0,
                "reason": wait_reason(r.status_message),
                "status_message": r.status_message,
            }
            seen[r.run_id] = entry
            out.append(entry)
        entry["jobs"] += 1
    for position, entry in enumerate(out):
        entry["position"] = position
    return out


async def apply_config_policies(db: Database, entries: list[tuple[str, q.QuotaPolicy]]) -> None:
    """Set the policies the server's ``config.yml`` gives (after its projects exist): each replaces the
    project's stored policy."""
    if not entries:
        return
    async with db.write() as conn:
        for name, policy in entries:
            project = await account_store.get_project(conn, name)
            if project is not None:
                await store.set_policy(conn, project.id, policy)


_SERIES = (
    ("corral_project_weighted_share", "gauge", "Weighted dominant share of the project's usage above nominal"),
    ("corral_project_quota_used", "gauge", "What the project's jobs hold, by resource"),
    ("corral_project_quota_max", "gauge", "The project's quota.max, by resource"),
    ("corral_project_quota_nominal", "gauge", "The project's nominal quota, by resource"),
    ("corral_project_entitlement", "gauge", "The project's entitlement (fair share of its fleets), by resource"),
)


async def metric_families(ctx: Context) -> list[Any]:
    """``/metrics`` series of each project with a policy: share, used, max, nominal and entitlement."""
    from corral.domain.telemetry import Family

    async with ctx.db.read() as conn:
        ids = list(await store.all_policies(conn))
        # the projects are read only when some has a policy (a scrape reads no list of every project otherwise)
        names = {p.id: p.name for p in await account_store.list_projects(conn, None) if p.id in ids} if ids else {}
    families = {name: Family(name, typ, text) for name, typ, text in _SERIES}
    for pid, name in sorted(names.items(), key=lambda kv: kv[1]):
        u = await _usage(ctx, pid, name)
        families["corral_project_weighted_share"].add({"project": name}, float(u["weighted_share"]))
        for key, family in (
            ("used", "corral_project_quota_used"),
            ("max", "corral_project_quota_max"),
            ("nominal", "corral_project_quota_nominal"),
            ("entitlement", "corral_project_entitlement"),
        ):
            for resource, amount in _flat(u[key]):
                families[family].add({"project": name, "resource": resource}, amount)
    return [f for f in families.values() if f.samples]


def _flat(doc: dict[str, Any]) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    for key, value in doc.items():
        if key == "gpu" and isinstance(value, dict):
            out += [("gpu" if m == "any" else f"gpu:{m}", float(v)) for m, v in value.items()]
        else:
            out.append((key, float(value)))
    return out
