"""Router: gateways (``/api/project/{p}/gateways/*``), dstack 0.22.5's eight routes and roles
(``routers/gateways.py``): ``list`` and ``get`` admit project members and anyone for a public project
(``ProjectMemberOrPublicAccess``, ``check_can_access_gateway``); the changes need a project admin
(``ProjectAdmin``). The logic is in :mod:`corral.services.gateways`."""

from __future__ import annotations

from starlette.requests import Request

from corral.api.deps import FastJSON, ctx_of, member
from corral.api.routes_accounts import parse
from corral.api.routing import RouteTable
from corral.schemas import requests as rq
from corral.services import gateways
from corral.services.errors import ServiceError

router = RouteTable()
P = "/api/project/{project_name}/gateways"


@router.post(P + "/list", body=rq.ListGatewaysBody, response="GatewayList")
async def gateway_list(request: Request, project_name: str) -> FastJSON:
    _u, project = await member(request, project_name, "member_or_public")
    await parse(rq.ListGatewaysBody, request)
    return FastJSON(await gateways.list_gateways(ctx_of(request), project))


@router.post(P + "/get", body=rq.NameBody, response="Gateway")
async def gateway_get(request: Request, project_name: str) -> FastJSON:
    _u, project = await member(request, project_name, "member_or_public")
    b = await parse(rq.NameBody, request)
    return FastJSON(await gateways.get(ctx_of(request), project, b.name))


@router.post(P + "/get_plan", body=rq.GatewayPlanBody, response="GatewayPlan", limit="spec")
async def gateway_plan(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name, "admin")
    b = await parse(rq.GatewayPlanBody, request)
    spec = b.spec
    return FastJSON(
        await gateways.get_plan(ctx_of(request), project, user, spec.configuration, spec.configuration_path)
    )


@router.post(P + "/apply", body=rq.GatewayApplyBody, response="Gateway", limit="spec")
async def gateway_apply(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name, "admin")
    b = await parse(rq.GatewayApplyBody, request)
    spec = b.plan.spec
    return FastJSON(
        await gateways.apply(
            ctx_of(request),
            project,
            user,
            spec.configuration,
            spec.configuration_path,
            b.plan.current_resource,
            b.force,
        )
    )


@router.post(P + "/create", body=rq.GatewayCreateBody, response="Gateway", limit="spec")
async def gateway_create(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name, "admin")
    b = await parse(rq.GatewayCreateBody, request)
    return FastJSON(await gateways.create(ctx_of(request), project, user, b.configuration))


@router.post(P + "/delete", body=rq.NamesBody, response="Null")
async def gateway_delete(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name, "admin")
    b = await parse(rq.NamesBody, request)
    await gateways.delete(ctx_of(request), project, user, list(b.names))
    return FastJSON(None)


@router.post(P + "/set_default", body=rq.GatewaySetDefaultBody, response="Null")
async def gateway_set_default(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name, "admin")
    b = await parse(rq.GatewaySetDefaultBody, request)
    if b.gateway_project is not None and b.gateway_project != project.name:
        raise ServiceError(
            f"gateway_project: gateways of another project ({b.gateway_project}) cannot be a default yet: "
            "corral does not import gateways; name a gateway of this project"
        )
    await gateways.set_default(ctx_of(request), project, user, b.name)
    return FastJSON(None)


@router.post(P + "/set_wildcard_domain", body=rq.GatewaySetWildcardDomainBody, response="Gateway")
async def gateway_set_wildcard_domain(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name, "admin")
    b = await parse(rq.GatewaySetWildcardDomainBody, request)
    return FastJSON(await gateways.set_wildcard_domain(ctx_of(request), project, user, b.name, b.wildcard_domain))
