"""Routers: a project's backends (dstack's ``routers/backends.py``): every project route is ``ProjectAdmin``;
the logic is in :mod:`corral.services.backends_api`."""

from __future__ import annotations

from starlette.requests import Request

from corral.api.deps import FastJSON, ctx_of, forget_access, member
from corral.api.routes_accounts import parse
from corral.api.routing import RouteTable
from corral.schemas import requests as rq
from corral.services import backends_api

router = RouteTable()
P = "/api/project/{project_name}/backends"


@router.post("/api/backends/list_types", body=rq.NoBody, response="BackendTypes", public=True)
async def list_backend_types() -> FastJSON:
    return FastJSON(backends_api.list_types())


@router.post(P + "/create", body=rq.BackendConfigBody, response="BackendConfig")
async def create_backend(request: Request, project_name: str) -> FastJSON:
    _user, project = await member(request, project_name, "admin")
    b = await parse(rq.BackendConfigBody, request)
    answer = await backends_api.create(ctx_of(request), project, b)
    forget_access(request)
    return FastJSON(answer)


@router.post(P + "/update", body=rq.BackendConfigBody, response="BackendConfig")
async def update_backend(request: Request, project_name: str) -> FastJSON:
    _user, project = await member(request, project_name, "admin")
    b = await parse(rq.BackendConfigBody, request)
    answer = await backends_api.update(ctx_of(request), project, b)
    forget_access(request)
    return FastJSON(answer)


@router.post(P + "/delete", body=rq.DeleteBackendsBody, response="Null")
async def delete_backends(request: Request, project_name: str) -> FastJSON:
    _user, project = await member(request, project_name, "admin")
    b = await parse(rq.DeleteBackendsBody, request)
    await backends_api.delete(ctx_of(request), project, b.backends_names)
    forget_access(request)
    return FastJSON(None)


@router.post(P + "/{backend_name}/config_info", body=rq.NoBody, response="BackendConfig")
async def config_info(request: Request, project_name: str, backend_name: str) -> FastJSON:
    _user, project = await member(request, project_name, "admin")
    return FastJSON(await backends_api.config_info(ctx_of(request), project, backend_name))


@router.post(P + "/create_yaml", body=rq.BackendYAMLBody, response="Null")
async def create_yaml(request: Request, project_name: str) -> FastJSON:
    _user, project = await member(request, project_name, "admin")
    b = await parse(rq.BackendYAMLBody, request)
    await backends_api.create_yaml(ctx_of(request), project, b.config_yaml)
    forget_access(request)
    return FastJSON(None)


@router.post(P + "/update_yaml", body=rq.BackendYAMLBody, response="Null")
async def update_yaml(request: Request, project_name: str) -> FastJSON:
    _user, project = await member(request, project_name, "admin")
    b = await parse(rq.BackendYAMLBody, request)
    await backends_api.update_yaml(ctx_of(request), project, b.config_yaml)
    forget_access(request)
    return FastJSON(None)


@router.post(P + "/{backend_name}/get_yaml", body=rq.NoBody, response="BackendInfoYAML")
async def get_yaml(request: Request, project_name: str, backend_name: str) -> FastJSON:
    _user, project = await member(request, project_name, "admin")
    return FastJSON(await backends_api.get_yaml(ctx_of(request), project, backend_name))
