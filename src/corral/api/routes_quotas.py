"""Routers: per-project quotas (``/api/projects/{project}/quotas/...``) and the scheduling queue.

``quotas/set`` is for global admins (the body replaces the project's policy); ``quotas/get`` and
``quotas/usage`` for any member of the project; ``scheduling/queue`` for any user, who sees the runs of
the projects they may read (a global admin: all).
"""

from __future__ import annotations

from starlette.requests import Request

from corral.api.deps import FastJSON, body_json, ctx_of, current_user, member
from corral.api.routing import RouteTable
from corral.schemas.requests import NoBody, QuotaSetBody

router = RouteTable()
P = "/api/projects/{project_name}/quotas"


@router.post(P + "/set", body=QuotaSetBody, response="QuotaPolicy")
async def set_quotas(request: Request, project_name: str) -> FastJSON:
    from corral.services import quotas

    user, project = await member(request, project_name)
    quotas.require_global_admin(user)
    return FastJSON(await quotas.set_policy(ctx_of(request), project, user, await body_json(request)))


@router.post(P + "/get", body=NoBody, response="QuotaPolicy")
async def get_quotas(request: Request, project_name: str) -> FastJSON:
    from corral.services import quotas

    _u, project = await member(request, project_name)
    return FastJSON(await quotas.get_policy(ctx_of(request), project))


@router.post(P + "/usage", body=NoBody, response="QuotaUsage")
async def quota_usage(request: Request, project_name: str) -> FastJSON:
    from corral.services import quotas

    _u, project = await member(request, project_name)
    return FastJSON(await quotas.usage(ctx_of(request), project))


@router.post("/api/scheduling/queue", body=NoBody, response="SchedulingQueue")
async def scheduling_queue(request: Request) -> FastJSON:
    from corral.services import quotas

    user = await current_user(request)
    return FastJSON(await quotas.queue(ctx_of(request), user))
