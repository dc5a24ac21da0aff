"""Fleets (and a fleet's page with its instances), instances and offers: read through the services the
API's fleets, instances and GPU routes call, with their rules; a fleet is deleted as ``fleets/delete``
deletes it (any project member, as the API)."""

from __future__ import annotations

import uuid
from typing import Any

import yaml
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from corral.api.deps import ctx_of
from corral.domain.access import backend_types
from corral.domain.records import InstanceQuery
from corral.services import accounts, fleets, serialize
from corral.ui import auth
from corral.ui.pages_events import recent
from corral.ui.pages_runs import shown_configuration
from corral.ui.render import page


def resources_text(instance_type: dict[str, Any] | None) -> str:
    """``4xCPU, 16GB, 1xA100 (80GB), 100GB (disk)``: an instance type's resources in dstack's words."""
    if not instance_type:
        return "—"
    r = instance_type.get("resources") or {}
    parts = [f"{r.get('cpus', 0)}xCPU", f"{(r.get('memory_mib') or 0) / 1024:.0f}GB"]
    gpus = r.get("gpus") or []
    if gpus:
        g = gpus[0]
        parts.append(f"{len(gpus)}x{g.get('name')} ({(g.get('memory_mib') or 0) / 1024:.0f}GB)")
    disk = (r.get("disk") or {}).get("size_mib")
    if disk:
        parts.append(f"{disk / 1024:.0f}GB (disk)")
    return ", ".join(parts)


def _is_id(ref: str) -> bool:
    try:
        uuid.UUID(ref)
    except ValueError:
        return False
    return True


def instance_row(i: dict[str, Any]) -> dict[str, Any]:
    return {**i, "resources": resources_text(i.get("instance_type"))}


async def fleets_list(request: Request) -> Response:
    s = await auth.require(request)
    ctx = ctx_of(request)
    project = request.query_params.get("project") or None
    ids = await accounts.member_project_ids(ctx.db, s.user, [project] if project else None)
    found = [serialize.fleet(f) for f in await fleets.list_fleets(ctx, ids, limit=1000)]
    for f in found:
        f["rows"] = [instance_row(i) for i in f.get("instances") or []]
        f["busy"] = sum(int(i.get("busy_blocks") or 0) for i in f["rows"])
        f["total"] = sum(int(i.get("total_blocks") or 0) for i in f["rows"])
    return page(request, "fleets.html", title="Fleets", nav="fleets", fleets=found, f_project=project or "")


async def fleet_page(request: Request) -> Response:
    s = await auth.require(request)
    ctx = ctx_of(request)
    project = await accounts.project_access(ctx.db, s.user, request.path_params["project"], "member")
    ref = request.path_params["fleet"]
    found = await fleets.get(ctx, project, None, ref) if _is_id(ref) else await fleets.get(ctx, project, ref, None)
    fleet = serialize.fleet(found)
    found_events = await recent(request, s.user, within_fleets=[fleet["id"]])

    return page(
        request,
        "fleet.html",
        events=found_events,
        title=f"Fleet {fleet['name']}",
        nav="fleets",
        fleet=fleet,
        project=project.name,
        rows=[instance_row(i) for i in fleet.get("instances") or []],
        configuration=yaml.safe_dump(
            shown_configuration((fleet.get("spec") or {}).get("configuration") or {}), sort_keys=False
        ),
    )


async def fleet_delete(request: Request) -> Response:
    s = await auth.require(request)
    await auth.form_of(request, s)
    ctx = ctx_of(request)
    project = await accounts.project_access(ctx.db, s.user, request.path_params["project"], "member")
    await fleets.delete(ctx, project, [request.path_params["fleet"]], s.user)
    return RedirectResponse("/fleets", status_code=303)


async def instances_list(request: Request) -> Response:
    s = await auth.require(request)
    ctx = ctx_of(request)
    project = request.query_params.get("project") or None
    ids = await accounts.member_project_ids(ctx.db, s.user, [project] if project else None)
    found = [instance_row(serialize.instance(i)) for i in await fleets.list_instances(ctx, InstanceQuery(ids))]
    return page(request, "instances.html", title="Instances", nav="instances", instances=found, f_project=project or "")


async def offers_list(request: Request) -> Response:
    """What each of the user's projects can get from its backends (``gpus/list`` reads the same offers)."""
    s = await auth.require(request)
    ctx = ctx_of(request)
    projects = await accounts.list_projects(ctx.db, s.user, include_not_joined=False)
    rows = []
    for p in projects:
        for compute in ctx.project_computes(backend_types(p.backends)):
            for offer in compute.offers():
                o = fleets.offer_json(offer)
                rows.append({**o, "project": p.name, "resources": resources_text(o.get("instance"))})
    rows.sort(key=lambda o: (o["project"], o["price"] or 0.0))
    return page(request, "offers.html", title="Offers", nav="offers", offers=rows[:500], total=len(rows))
