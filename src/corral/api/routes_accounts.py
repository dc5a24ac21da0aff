"""Routers: server info, users, projects and members, templates, OAuth2 providers (backends: ``routes_backends``)."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from corral import DSTACK_API_VERSION, __version__
from corral.api.deps import FastJSON, body_json, ctx_of, current_user, forget_access, member
from corral.api.routing import RequestValidationError, RouteTable
from corral.schemas import requests as rq
from corral.services import accounts, members, public_keys, serialize
from corral.services.errors import ServiceError

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


@router.get("/healthcheck", response="Healthcheck", public=True)
async def healthcheck() -> FastJSON:
    return FastJSON({"status": "running"})


@router.post("/api/server/get_info", body=rq.NoBody, response="ServerInfo", public=True)
async def get_info() -> FastJSON:
    return FastJSON({"server_version": DSTACK_API_VERSION, "corral_version": __version__})


# --- users ------------------------------------------------------------------------------------------


@router.post("/api/users/get_my_user", body=rq.NoBody, response="UserWithCreds")
async def get_my_user(request: Request) -> FastJSON:
    user = await current_user(request)
    return FastJSON(serialize.user_with_creds(user, ctx_of(request).cipher))


@router.post("/api/users/get_user", body=rq.UsernameBody, response="UserWithCreds")
async def get_user(request: Request) -> FastJSON:
    user = await current_user(request)
    body = await parse(rq.UsernameBody, request)
    ctx = ctx_of(request)
    return FastJSON(serialize.user_with_creds(await accounts.get_user(ctx.db, user, body.username), ctx.cipher))


@router.post("/api/users/list", body=rq.ListUsersBody, response="UsersList")
async def list_users(request: Request) -> FastJSON:
    user = await current_user(request)
    body = await parse(rq.ListUsersBody, request)
    users = [serialize.user(u) for u in await accounts.list_users(ctx_of(request).db, user)]
    if body.return_total_count:
        return FastJSON({"total_count": len(users), "users": users[: body.limit]})
    return FastJSON(users[: body.limit])


@router.post("/api/users/create", body=rq.CreateUserBody, response="User")
async def create_user(request: Request) -> FastJSON:
    admin = await current_user(request)
    accounts.require_admin(admin)
    b = await parse(rq.CreateUserBody, request)
    ctx = ctx_of(request)
    created = await accounts.create_user(
        ctx.db, b.username, b.global_role, b.email, b.active, cipher=ctx.cipher(), actor=admin
    )
    return FastJSON(serialize.user(created))


@router.post("/api/users/update", body=rq.CreateUserBody, response="User")
async def update_user(request: Request) -> FastJSON:
    admin = await current_user(request)
    accounts.require_admin(admin)
    b = await parse(rq.CreateUserBody, request)
    forget_access(request)
    updated = await accounts.update_user(ctx_of(request).db, b.username, b.global_role, b.email, b.active, admin)
    return FastJSON(serialize.user(updated))


@router.post("/api/users/refresh_token", body=rq.UsernameBody, response="UserWithCreds")
async def refresh_token(request: Request) -> FastJSON:
    user = await current_user(request)
    b = await parse(rq.UsernameBody, request)
    ctx = ctx_of(request)
    refreshed = await accounts.refresh_token(ctx.db, user, b.username, cipher=ctx.cipher())
    forget_access(request)
    return FastJSON(serialize.user_with_creds(refreshed, ctx.cipher))


@router.post("/api/users/refresh_ssh_key", body=rq.UsernameBody, response="UserWithCreds")
async def refresh_ssh_key(request: Request) -> FastJSON:
    user = await current_user(request)
    b = await parse(rq.UsernameBody, request)
    ctx = ctx_of(request)
    updated = await accounts.refresh_ssh_key(ctx.db, user, b.username, cipher=ctx.cipher())
    forget_access(request)
    return FastJSON(serialize.user_with_creds(updated, ctx.cipher))


@router.post("/api/users/public_keys/list", body=rq.NoBody, response="PublicKeyList")
async def list_public_keys(request: Request) -> FastJSON:
    user = await current_user(request)
    return FastJSON(await public_keys.list_keys(ctx_of(request).db, user))


@router.post("/api/users/public_keys/add", body=rq.AddPublicKeyBody, response="PublicKeyInfo")
async def add_public_key(request: Request) -> FastJSON:
    user = await current_user(request)
    b = await parse(rq.AddPublicKeyBody, request)
    return FastJSON(await public_keys.add_key(ctx_of(request).db, user, b.key, b.name))


@router.post("/api/users/public_keys/delete", body=rq.DeletePublicKeysBody, response="Null")
async def delete_public_keys(request: Request) -> FastJSON:
    user = await current_user(request)
    b = await parse(rq.DeletePublicKeysBody, request)
    await public_keys.delete_keys(ctx_of(request).db, user, [str(i) for i in b.ids])
    return FastJSON(None)


@router.post("/api/users/delete", body=rq.DeleteUsersBody, response="Null")
async def delete_users(request: Request) -> FastJSON:
    admin = await current_user(request)
    accounts.require_admin(admin)
    b = await parse(rq.DeleteUsersBody, request)
    await accounts.delete_users(ctx_of(request).db, b.users, admin)
    forget_access(request)
    return FastJSON(None)


# --- projects ---------------------------------------------------------------------------------------


@router.post("/api/projects/list", body=rq.ListProjectsBody, response="ProjectsList")
async def list_projects(request: Request) -> FastJSON:
    user = await current_user(request)
    body = await parse(rq.ListProjectsBody, request)
    found = await accounts.list_projects(ctx_of(request).db, user, body.include_not_joined)
    projects = [serialize.project(p) for p in found]
    if body.return_total_count:
        return FastJSON({"total_count": len(projects), "projects": projects[: body.limit]})
    return FastJSON(projects[: body.limit])


@router.post("/api/projects/list_only_no_fleets", body=rq.NoBody, response="ProjectList")
async def list_only_no_fleets(request: Request) -> FastJSON:
    user = await current_user(request)
    return FastJSON([serialize.project(p) for p in await accounts.projects_without_fleets(ctx_of(request).db, user)])


@router.post("/api/projects/create", body=rq.CreateProjectBody, response="Project")
async def create_project(request: Request) -> FastJSON:
    user = await current_user(request)
    b = await parse(rq.CreateProjectBody, request)
    if b.templates_repo:
        raise ServiceError("Templates repos are not supported yet by corral")
    db = ctx_of(request).db
    project = await accounts.create_project(db, user, b.project_name, b.is_public, cipher=ctx_of(request).cipher())
    forget_access(request)
    members = await accounts.project_members(db, project)
    return FastJSON(serialize.project(project, members, ctx_of(request).managers_manage_secrets))


@router.post("/api/projects/delete", body=rq.DeleteProjectsBody, response="Null")
async def delete_projects(request: Request) -> FastJSON:
    user = await current_user(request)
    b = await parse(rq.DeleteProjectsBody, request)
    await accounts.delete_projects(ctx_of(request).db, user, b.projects_names)
    forget_access(request)
    return FastJSON(None)


async def _project_out(request: Request, project: Any) -> FastJSON:
    ctx = ctx_of(request)
    members = await accounts.project_members(ctx.db, project)
    return FastJSON(serialize.project(project, members, ctx.managers_manage_secrets))


# Each route admits callers by dstack's dependency for it (corral.domain.access names them); the member
# routes then apply dstack's rules on admins (corral.services.members).


@router.post("/api/projects/{project_name}/get", body=rq.NoBody, response="Project")
async def get_project(request: Request, project_name: str) -> FastJSON:
    _user, project = await member(request, project_name, "member_or_public")
    return await _project_out(request, project)


@router.post("/api/projects/{project_name}/update", body=rq.UpdateProjectBody, response="Project")
async def update_project(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name, "admin")
    b = await parse(rq.UpdateProjectBody, request)
    if b.templates_repo and not b.reset_templates_repo:
        raise ServiceError("Templates repos are not supported yet by corral")
    updated = await accounts.update_project(ctx_of(request).db, project, b.is_public, user)
    forget_access(request)
    return await _project_out(request, updated)


@router.post("/api/projects/{project_name}/set_members", body=rq.SetMembersBody, response="Project")
async def set_members(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name, "manager")
    b = await parse(rq.SetMembersBody, request)
    await members.set_members(ctx_of(request).db, user, project, b.members)
    forget_access(request)
    return await _project_out(request, project)


@router.post("/api/projects/{project_name}/add_members", body=rq.SetMembersBody, response="Project")
async def add_members(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name, "manager_or_public")
    b = await parse(rq.SetMembersBody, request)
    await members.add_members(ctx_of(request).db, user, project, b.members)
    forget_access(request)
    return await _project_out(request, project)


@router.post("/api/projects/{project_name}/remove_members", body=rq.RemoveMembersBody, response="Project")
async def remove_members(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name, "member")
    b = await parse(rq.RemoveMembersBody, request)
    await members.remove_members(ctx_of(request).db, user, project, b.usernames)
    forget_access(request)
    return await _project_out(request, project)


@router.post("/api/project/{project_name}/templates/list", body=rq.NoBody, response="EmptyList")
async def list_templates(request: Request, project_name: str) -> FastJSON:
    """dstack's UI templates come from a project's ``templates_repo``, which corral does not support (it
    refuses to set one): the list is empty, as dstack's is without a templates repo."""
    await member(request, project_name)
    return FastJSON([])


# --- OAuth2 (dstack's open-source server registers no providers; nor does corral) ------------------------


@router.post("/api/auth/list_providers", body=rq.NoBody, response="OAuthProviders", public=True)
async def list_auth_providers() -> FastJSON:
    return FastJSON([])


@router.post("/api/auth/get_next_redirect", body=rq.NextRedirectBody, response="NextRedirect", public=True)
async def get_next_redirect(request: Request) -> FastJSON:
    from corral.services import oauth  # rarely called: not on the start path

    b = await parse(rq.NextRedirectBody, request)
    return FastJSON({"redirect_url": oauth.next_redirect_url(b.code, b.state)})
