"""Routers: exports and imports (sharing fleets across projects)."""

from __future__ import annotations

from starlette.requests import Request

from corral.api.deps import FastJSON, ctx_of, member
from corral.api.routes_accounts import parse
from corral.api.routing import RouteTable
from corral.schemas import exports as rq
from corral.schemas.requests import NoBody
from corral.services import exports

router = RouteTable()
P = "/api/project/{project_name}"


@router.post(P + "/exports/create", body=rq.CreateExportBody, response="Export")
async def create(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name, "admin")
    b = await parse(rq.CreateExportBody, request)
    return FastJSON(await exports.create(ctx_of(request), project, user, b))


@router.post(P + "/exports/update", body=rq.UpdateExportBody, response="Export")
async def update(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name, "admin")
    b = await parse(rq.UpdateExportBody, request)
    return FastJSON(await exports.update(ctx_of(request), project, user, b))


@router.post(P + "/exports/delete", body=rq.ExportNameBody, response="Null")
async def delete(request: Request, project_name: str) -> FastJSON:
    _u, project = await member(request, project_name, "admin")
    b = await parse(rq.ExportNameBody, request)
    await exports.delete(ctx_of(request), project, b.name)
    return FastJSON(None)


@router.post(P + "/exports/list", body=NoBody, response="ExportList")
async def list_exports(request: Request, project_name: str) -> FastJSON:
    _u, project = await member(request, project_name)
    return FastJSON(await exports.list_exports(ctx_of(request), project))


@router.post(P + "/imports/list", body=NoBody, response="ImportList")
async def list_imports(request: Request, project_name: str) -> FastJSON:
    _u, project = await member(request, project_name)
    return FastJSON(await exports.list_imports(ctx_of(request), project))


@router.post(P + "/imports/delete", body=rq.DeleteImportBody, response="Null")
async def delete_import(request: Request, project_name: str) -> FastJSON:
    _u, project = await member(request, project_name, "admin")
    b = await parse(rq.DeleteImportBody, request)
    await exports.delete_import(ctx_of(request), project, b.export_name, b.export_project_name)
    return FastJSON(None)
