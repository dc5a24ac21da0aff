"""Router: network volumes (``volumes/create|list|get|delete``, ``/api/volumes/list``), dstack's routes and
roles (``ProjectMember`` for every project route; the global list covers the caller's projects)."""

from __future__ import annotations

from starlette.requests import Request

from corral.api.deps import FastJSON, ctx_of, current_user, member, member_project_ids
from corral.api.routes_accounts import parse
from corral.api.routing import RouteTable
from corral.schemas import requests as rq
from corral.services import volumes

router = RouteTable()
P = "/api/project/{project_name}"


@router.post(P + "/volumes/create", body=rq.VolumeCreateBody, response="Volume", limit="spec")
async def volume_create(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name)
    b = await parse(rq.VolumeCreateBody, request)
    return FastJSON(await volumes.create(ctx_of(request), project, user, b.configuration))


@router.post(P + "/volumes/list", body=rq.NoBody, response="VolumeList")
async def project_volume_list(request: Request, project_name: str) -> FastJSON:
    _u, project = await member(request, project_name)
    return FastJSON(await volumes.list_volumes(ctx_of(request), [project.id]))


# No ``include_imported`` here: dstack 0.22.5's ``ListVolumesRequest`` (``server/schemas/volumes.py``) has none (an
# export holds fleets and gateways, never volumes) and its models forbid other fields, so a body with it is refused
# there as here.
@router.post("/api/volumes/list", body=rq.ListVolumesBody, response="VolumeList")
async def volume_list(request: Request) -> FastJSON:
    user = await current_user(request)
    b = await parse(rq.ListVolumesBody, request)
    ids = await member_project_ids(request, user, [b.project_name] if b.project_name else None)
    found = await volumes.list_volumes(
        ctx_of(request), ids, only_active=b.only_active, ascending=b.ascending, limit=b.limit
    )
    return FastJSON(found)


@router.post(P + "/volumes/get", body=rq.NameBody, response="Volume")
async def volume_get(request: Request, project_name: str) -> FastJSON:
    _u, project = await member(request, project_name)
    b = await parse(rq.NameBody, request)
    return FastJSON(await volumes.get(ctx_of(request), project, b.name))


@router.post(P + "/volumes/delete", body=rq.NamesBody, response="Null")
async def volume_delete(request: Request, project_name: str) -> FastJSON:
    _u, project = await member(request, project_name)
    b = await parse(rq.NamesBody, request)
    await volumes.delete(ctx_of(request), project, list(b.names))
    return FastJSON(None)
