"""Routers: fleets, instances, runs, logs; the small lists the official CLI reads (events, secrets, metrics,
GPUs). Gateways have their own router (``routes_gateways``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request

from corral import diskspace  # config lazy: the models load on first use, not at start-up
from corral.api.deps import FastJSON, ctx_of, current_user, member, member_project_ids
from corral.api.routes_accounts import parse
from corral.api.routing import RequestValidationError, RouteTable
from corral.domain.records import InstanceQuery, ProjectRec, UserRec
from corral.domain.times import epoch_seconds
from corral.schemas import requests as rq
from corral.services import accounts, events, exports, fleets, logs, runs, serialize
from corral.services.errors import Forbidden, ResourceNotExists
from corral.services.run_apply import apply as apply_run

log = logging.getLogger("corral.api")

router = RouteTable()
P = "/api/project/{project_name}"


async def _member_project_ids(request: Request, user: UserRec, names: list[str] | None) -> list[str] | None:
    """The projects a global list (``/api/runs/list``, fleets, instances) covers: member projects only (all
    for a global admin: None), narrowed to ``names``; a project the caller may not see just lists nothing.
    The caller is authenticated before the body is read (an anonymous body is never parsed)."""
    return await member_project_ids(request, user, names)


# --- fleets -----------------------------------------------------------------------------------------


@router.post("/api/fleets/list", body=rq.ListFleetsBody, response="FleetList")
async def list_all_fleets(request: Request) -> FastJSON:
    user = await current_user(request)
    b = await parse(rq.ListFleetsBody, request)
    ids = await _member_project_ids(request, user, [b.project_name] if b.project_name else None)
    after = (epoch_seconds(b.prev_created_at), str(b.prev_id or "")) if b.prev_created_at else None
    # dstack's ``only_active`` leaves the deleted fleets out, which corral's lists never show; ``include_imported``
    # adds the fleets exported to the caller's projects (a global admin's list has every project's already)
    found = await fleets.list_fleets(
        ctx_of(request), ids, limit=b.limit, ascending=b.ascending, after=after, include_imported=b.include_imported
    )
    return FastJSON([serialize.fleet(f) for f in found])


@router.post(P + "/fleets/list", body=rq.ProjectFleetsBody, response="FleetList")
async def list_fleets(request: Request, project_name: str) -> FastJSON:
    _u, project = await member(request, project_name)
    b = await parse(rq.ProjectFleetsBody, request)
    found = await fleets.list_fleets(ctx_of(request), [project.id])
    if b.include_imported:
        found += await fleets.imported_fleets(ctx_of(request), project)
    return FastJSON([serialize.fleet(f) for f in found])


async def _member_or_importer(request: Request, project_name: str) -> tuple[ProjectRec, bool]:
    """The project, and whether the caller is its member; a non-member may still read what the project
    exports to one of the caller's projects (dstack's ``check_can_access_fleet``/``_instance``)."""
    try:
        _u, project = await member(request, project_name)
        return project, True
    except Forbidden:
        return await accounts.find_project(ctx_of(request).db, project_name), False


@router.post(P + "/fleets/get", body=rq.GetByNameOrId, response="Fleet")
async def get_fleet(request: Request, project_name: str) -> FastJSON:
    user = await current_user(request)
    ctx = ctx_of(request)
    project, own = await _member_or_importer(request, project_name)
    b = await parse(rq.GetByNameOrId, request)
    if own:
        return FastJSON(serialize.fleet(await fleets.get(ctx, project, b.name, str(b.id) if b.id else None)))
    # dstack's check_can_access_fleet: members of a project the fleet is exported to may read it too
    try:
        found = await fleets.get(ctx, project, b.name, str(b.id) if b.id else None)
    except ResourceNotExists:
        raise Forbidden() from None
    if not await exports.imported_by_member_project(ctx, user, project, found.id):
        raise Forbidden()
    return FastJSON(serialize.fleet(found))


@router.post(P + "/fleets/get_plan", body=rq.FleetPlanBody, response="FleetPlan", limit="spec")
async def fleet_plan(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name)
    b = await parse(rq.FleetPlanBody, request)
    return FastJSON(await fleets.get_plan(ctx_of(request), project, user, b.spec))


@router.post(P + "/fleets/apply", body=rq.ApplyFleetBody, response="Fleet", limit="spec")
async def fleet_apply(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name)
    b = await parse(rq.ApplyFleetBody, request)
    return FastJSON(await fleets.apply(ctx_of(request), project, b.plan, b.force, user))


async def _freeing_space(request: Request, call: Callable[[], Awaitable[object]]) -> None:
    """A stop or a delete: what frees space. One that could not be written for lack of it is written again
    once the state directory's emergency reserve (``diskspace.release_reserve``) has given its room back (not
    when Postgres's disk is the full one: its 507 says so)."""
    try:
        await call()
    except Exception as e:
        settings = ctx_of(request).settings
        if not diskspace.is_disk_full(e) or diskspace.database_full(e):
            raise
        if not diskspace.release_reserve(settings.server_dir):
            raise
        log.warning(
            "the disk of %s is full: its emergency reserve was released so that %s could be written (it is made "
            "again at the next start with room)",
            settings.server_dir,
            request.url.path,
            extra={"event": "disk_reserve_released"},
        )
        await call()


@router.post(P + "/fleets/delete", body=rq.NamesBody, response="Null")
async def fleet_delete(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name)
    b = await parse(rq.NamesBody, request)
    await _freeing_space(request, lambda: fleets.delete(ctx_of(request), project, b.names, user))
    return FastJSON(None)


@router.post(P + "/fleets/delete_instances", body=rq.DeleteInstancesBody, response="Null")
async def fleet_delete_instances(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name)
    b = await parse(rq.DeleteInstancesBody, request)
    await fleets.delete_instances(ctx_of(request), project, b.name, b.instance_nums, user)
    return FastJSON(None)


@router.post("/api/instances/list", body=rq.ListInstancesBody, response="InstanceList")
async def list_instances(request: Request) -> FastJSON:
    user = await current_user(request)
    b = await parse(rq.ListInstancesBody, request)
    ids = await _member_project_ids(request, user, b.project_names)
    fleet_ids = [str(f) for f in b.fleet_ids] if b.fleet_ids is not None else None
    after = (epoch_seconds(b.prev_created_at), str(b.prev_id) if b.prev_id else None) if b.prev_created_at else None
    query = InstanceQuery(ids, fleet_ids, b.only_active, after, b.ascending, b.limit, b.include_imported)
    found = await fleets.list_instances(ctx_of(request), query)
    return FastJSON([serialize.instance(i) for i in found])


@router.post(P + "/instances/get", body=rq.GetInstanceBody, response="Instance")
async def get_instance(request: Request, project_name: str) -> FastJSON:
    user = await current_user(request)
    ctx = ctx_of(request)
    project, own = await _member_or_importer(request, project_name)
    b = await parse(rq.GetInstanceBody, request)
    if own:
        return FastJSON(serialize.instance(await fleets.get_instance(ctx, project, str(b.id))))
    # dstack's check_can_access_instance: members of a project the instance's fleet is exported to
    try:
        found = await fleets.get_instance(ctx, project, str(b.id))
    except ResourceNotExists:
        raise Forbidden() from None
    if not await exports.imported_by_member_project(ctx, user, project, found.fleet_id):
        raise Forbidden()
    return FastJSON(serialize.instance(found))


@router.post(
    P + "/instances/get_instance_health_checks", body=rq.InstanceHealthChecksBody, response="InstanceHealthChecks"
)
async def instance_health_checks(request: Request, project_name: str) -> FastJSON:
    _u, project = await member(request, project_name)
    b = await parse(rq.InstanceHealthChecksBody, request)
    checks = await fleets.instance_health_checks(ctx_of(request), project, b.fleet_name, b.instance_num)
    return FastJSON({"health_checks": checks})


# --- runs -------------------------------------------------------------------------------------------


@router.post("/api/runs/list", body=rq.ListRunsBody, response="RunList")
async def list_all_runs(request: Request) -> FastJSON:
    user = await current_user(request)
    b = await parse(rq.ListRunsBody, request)
    if b.project_name is None and b.repo_id is not None:
        return FastJSON([])  # dstack: a repo id without a project lists nothing
    ids = await _member_project_ids(request, user, [b.project_name] if b.project_name else None)
    user_id = None
    if b.username:
        user_id = (await accounts.find_user(ctx_of(request).db, b.username)).id
    return FastJSON(await runs.list_runs(ctx_of(request), ids, b, user_id))


@router.post(P + "/runs/list", body=rq.ListRunsBody, response="RunList")
async def list_runs(request: Request, project_name: str) -> FastJSON:
    _u, project = await member(request, project_name)
    b = await parse(rq.ListRunsBody, request)
    return FastJSON(await runs.list_runs(ctx_of(request), [project.id], b, None))


@router.post(P + "/runs/get", body=rq.GetRunBody, response="Run")
async def get_run(request: Request, project_name: str) -> FastJSON:
    _u, project = await member(request, project_name)
    b = await parse(rq.GetRunBody, request)
    return FastJSON(await runs.get(ctx_of(request), project, b.run_name, str(b.id) if b.id else None))


@router.post(P + "/runs/get_plan", body=rq.RunPlanBody, response="RunPlan", limit="spec")
async def run_plan(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name)
    b = await parse(rq.RunPlanBody, request)
    return FastJSON(await runs.get_plan(ctx_of(request), project, user, b))


@router.post(P + "/runs/apply", body=rq.ApplyRunBody, response="Run", limit="spec")
async def run_apply(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name)
    b = await parse(rq.ApplyRunBody, request)
    return FastJSON(await apply_run(ctx_of(request), project, user, b.plan, b.force))


@router.post(P + "/runs/stop", body=rq.StopRunsBody, response="Null")
async def run_stop(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name)
    b = await parse(rq.StopRunsBody, request)
    await _freeing_space(request, lambda: runs.stop(ctx_of(request), project, b.runs_names, b.abort, user))
    return FastJSON(None)


@router.post(P + "/runs/delete", body=rq.DeleteRunsBody, response="Null")
async def run_delete(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name)
    b = await parse(rq.DeleteRunsBody, request)
    await _freeing_space(request, lambda: runs.delete(ctx_of(request), project, b.runs_names, user))
    return FastJSON(None)


@router.post(P + "/logs/poll", body=rq.PollLogsBody, response="JobLogs")
async def logs_poll(request: Request, project_name: str) -> FastJSON:
    _u, project = await member(request, project_name)
    b = await parse(rq.PollLogsBody, request)
    return FastJSON(await logs.poll(ctx_of(request), project, b))


@router.post("/api/events/list", body=rq.ListEventsBody, response="EventList")
async def events_list(request: Request) -> FastJSON:
    user = await current_user(request)
    b = await parse(rq.ListEventsBody, request)
    return FastJSON(await events.list_events(ctx_of(request).db, user, b))


# --- endpoints the official CLI calls that corral answers minimally for now -----------------------------


@router.get(P + "/metrics/job/{run_name}", response="JobMetrics")
async def job_metrics(request: Request, project_name: str, run_name: str) -> FastJSON:
    """dstack's query: ``run_id``, ``replica_num``, ``job_num``, ``limit`` (default 1), ``after``, ``before``."""
    _u, project = await member(request, project_name)
    try:
        q = rq.JobMetricsQuery.model_validate(dict(request.query_params))
    except ValidationError as e:
        raise RequestValidationError(
            [{**err, "loc": ("query", *err["loc"])} for err in e.errors(include_url=False)]
        ) from None
    from corral.services import metrics  # on first use: not on the server's start path

    return FastJSON(await metrics.job_metrics(ctx_of(request), project, run_name, q))


@router.post(P + "/gpus/list", body=rq.ListGpusBody, response="GpuList")
async def gpus_list(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name)
    body = await parse(rq.ListGpusBody, request)  # validated as dstack does
    groups: dict[tuple[str, int, str], dict[str, Any]] = {}
    for offer in runs.gpu_offers(ctx_of(request), project, user, body.run_spec):
        gpus = offer.resources.gpus
        g = gpus[0]
        key = (g.name, g.memory_mib, g.vendor)
        entry = groups.setdefault(
            key,
            {
                "name": g.name,
                "memory_mib": g.memory_mib,
                "vendor": g.vendor,
                "availability": ["available"],
                "spot": [],
                "count": {"min": len(gpus), "max": len(gpus)},
                "price": {"min": offer.price, "max": offer.price},
                "backends": [],
                "regions": [],
            },
        )
        market = "spot" if offer.resources.spot else "on-demand"
        if market not in entry["spot"]:
            entry["spot"] = sorted([*entry["spot"], market])
        entry["count"]["min"] = min(entry["count"]["min"], len(gpus))
        entry["count"]["max"] = max(entry["count"]["max"], len(gpus))
        entry["price"]["min"] = min(entry["price"]["min"], offer.price)
        entry["price"]["max"] = max(entry["price"]["max"], offer.price)
        backend = serialize.WIRE_BACKEND.get(offer.backend, offer.backend)
        if backend not in entry["backends"]:
            entry["backends"].append(backend)
        if offer.region not in entry["regions"]:
            entry["regions"].append(offer.region)
    return FastJSON({"gpus": list(groups.values())})
