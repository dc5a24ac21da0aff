"""Routers: a project's secrets (dstack's ``routers/secrets.py``): every route is ``ProjectManager``, then
the service's ``_check_can_manage_secrets`` (:mod:`corral.services.secrets`)."""

from __future__ import annotations

from starlette.requests import Request

from corral.api.deps import FastJSON, ctx_of, current_user, member
from corral.api.routes_accounts import parse
from corral.api.routing import RouteTable
from corral.domain.records import ProjectRec
from corral.schemas import requests as rq
from corral.services import secrets

router = RouteTable()
P = "/api/project/{project_name}/secrets"


async def _manager(request: Request, project_name: str) -> ProjectRec:
    user, project = await member(request, project_name, "manager")
    await secrets.require_manager(ctx_of(request), user, project)
    return project


@router.post(P + "/list", body=rq.NoBody, response="SecretList")
async def list_secrets(request: Request, project_name: str) -> FastJSON:
    project = await _manager(request, project_name)
    return FastJSON(await secrets.list_secrets(ctx_of(request), project))


@router.post(P + "/get", body=rq.GetSecretBody, response="Secret")
async def get_secret(request: Request, project_name: str) -> FastJSON:
    project = await _manager(request, project_name)
    b = await parse(rq.GetSecretBody, request)
    return FastJSON(await secrets.get_secret(ctx_of(request), project, b.name))


@router.post(P + "/create_or_update", body=rq.CreateOrUpdateSecretBody, response="Secret")
async def create_or_update(request: Request, project_name: str) -> FastJSON:
    project = await _manager(request, project_name)
    b = await parse(rq.CreateOrUpdateSecretBody, request)
    user = await current_user(request)
    answer, _what = await secrets.create_or_update(ctx_of(request), project, b.name, b.value, user)
    return FastJSON(answer)


@router.post(P + "/delete", body=rq.DeleteSecretsBody, response="Null")
async def delete_secrets(request: Request, project_name: str) -> FastJSON:
    project = await _manager(request, project_name)
    b = await parse(rq.DeleteSecretsBody, request)
    await secrets.delete(ctx_of(request), project, b.secrets_names, await current_user(request))
    return FastJSON(None)
