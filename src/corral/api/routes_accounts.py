"""Routers: server info, users, projects and members, backends."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from corral import DSTACK_API_VERSION, __version__
from corral.api.deps import FastJSON, body_json, ctx_of, current_user, forget_access, member
from corral.api.routing import RequestValidationError, RouteTable
from corral.schemas import requests as rq
from corral.services import accounts, serialize

router = RouteTable()
M = TypeVar("M", bound=BaseModel)


async def parse(model: type[M], request: Request) -> M:
    data = await body_json(request)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError(
            [{**err, "loc": ("body", *err["loc"])} for err in e.errors(include_url=False)]
        ) from None


@router.get("/healthcheck")
async def healthcheck() -> FastJSON:
    return FastJSON({"status": "running"})


@router.post("/api/server/get_info")
async def get_info() -> FastJSON:
    return FastJSON({"server_version": DSTACK_API_VERSION, "corral_version": __version__})


@router.post("/api/backends/list_types")
async def list_backend_types() -> FastJSON:
    return FastJSON(["remote"])


# --- users ------------------------------------------------------------------------------------------


@router.post("/api/users/get_my_user")
async def get_my_user(request: Request) -> FastJSON:
    user = await current_user(request)
    return FastJSON(serialize.user_with_creds(user))


@router.post("/api/users/get_user", body=rq.UsernameBody)
async def get_user(request: Request) -> FastJSON:
    user = await current_user(request)
    body = await parse(rq.UsernameBody, request)
    return FastJSON(serialize.user_with_creds(await accounts.get_user(ctx_of(request).db, user, body.username)))


@router.post("/api/users/list", body=rq.ListUsersBody)
async def list_users(request: Request) -> FastJSON:
    user = await current_user(request)
    body = await parse(rq.ListUsersBody, request)
    users = [serialize.user(u) for u in await accounts.list_users(ctx_of(request).db, user)]
    if body.return_total_count:
        return FastJSON({"total_count": len(users), "users": users[: body.limit]})
    return FastJSON(users[: body.limit])


@router.post("/api/users/create", body=rq.CreateUserBody)
async def create_user(request: Request) -> FastJSON:
    accounts.require_admin(await current_user(request))
    b = await parse(rq.CreateUserBody, request)
    return FastJSON(
        serialize.user(await accounts.create_user(ctx_of(request).db, b.username, b.global_role, b.email, b.active))
    )


@router.post("/api/users/update", body=rq.CreateUserBody)
async def update_user(request: Request) -> FastJSON:
    accounts.require_admin(await current_user(request))
    b = await parse(rq.CreateUserBody, request)
    forget_access(request)
    return FastJSON(
        serialize.user(await accounts.update_user(ctx_of(request).db, b.username, b.global_role, b.email, b.active))
    )


@router.post("/api/users/refresh_token", body=rq.UsernameBody)
async def refresh_token(request: Request) -> FastJSON:
    user = await current_user(request)
    b = await parse(rq.UsernameBody, request)
    forget_access(request)
    return FastJSON(serialize.user_with_creds(await accounts.refresh_token(ctx_of(request).db, user, b.username)))


@router.post("/api/users/delete", body=rq.DeleteUsersBody)
async def delete_users(request: Request) -> FastJSON:
    accounts.require_admin(await current_user(request))
    b = await parse(rq.DeleteUsersBody, request)
    await accounts.delete_users(ctx_of(request).db, b.users)
    forget_access(request)
    return FastJSON(None)


# --- projects ---------------------------------------------------------------------------------------


@router.post("/api/projects/list", body=rq.ListProjectsBody)
async def list_projects(request: Request) -> FastJSON:
    user = await current_user(request)
    body = await parse(rq.ListProjectsBody, request)
    projects = [serialize.project(p) for p in await accounts.list_projects(ctx_of(request).db, user)]
    if body.return_total_count:
        return FastJSON({"total_count": len(projects), "projects": projects[: body.limit]})
    return FastJSON(projects[: body.limit])


@router.post("/api/projects/create", body=rq.CreateProjectBody)
async def create_project(request: Request) -> FastJSON:
    user = await current_user(request)
    b = await parse(rq.CreateProjectBody, request)
    db = ctx_of(request).db
    project = await accounts.create_project(db, user, b.project_name, b.is_public)
    return FastJSON(serialize.project(project, await accounts.project_members(db, project)))


@router.post("/api/projects/delete", body=rq.DeleteProjectsBody)
async def delete_projects(request: Request) -> FastJSON:
    user = await current_user(request)
    b = await parse(rq.DeleteProjectsBody, request)
    await accounts.delete_projects(ctx_of(request).db, user, b.projects_names)
    forget_access(request)
    return FastJSON(None)


async def _project_out(request: Request, project: Any) -> FastJSON:
    return FastJSON(serialize.project(project, await accounts.project_members(ctx_of(request).db, project)))


@router.post("/api/projects/{project_name}/get")
async def get_project(request: Request, project_name: str) -> FastJSON:
    _user, project = await member(request, project_name)
    return await _project_out(request, project)


@router.post("/api/projects/{project_name}/set_members", body=rq.SetMembersBody)
async def set_members(request: Request, project_name: str) -> FastJSON:
    _user, project = await member(request, project_name, "manager")
    b = await parse(rq.SetMembersBody, request)
    await accounts.set_members(ctx_of(request).db, project, [m.model_dump() for m in b.members])
    forget_access(request)
    return await _project_out(request, project)


@router.post("/api/projects/{project_name}/add_members", body=rq.SetMembersBody)
async def add_members(request: Request, project_name: str) -> FastJSON:
    _user, project = await member(request, project_name, "manager")
    b = await parse(rq.SetMembersBody, request)
    await accounts.add_members(ctx_of(request).db, project, [m.model_dump() for m in b.members])
    forget_access(request)
    return await _project_out(request, project)


@router.post("/api/projects/{project_name}/remove_members", body=rq.RemoveMembersBody)
async def remove_members(request: Request, project_name: str) -> FastJSON:
    user = await current_user(request)
    b = await parse(rq.RemoveMembersBody, request)
    need = "user" if b.usernames == [user.name] else "manager"
    _user, project = await member(request, project_name, need)
    await accounts.remove_members(ctx_of(request).db, project, b.usernames)
    forget_access(request)
    return await _project_out(request, project)
