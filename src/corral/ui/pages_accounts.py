"""Projects (and a project's page: its members and their roles, added and removed; its secrets, for those
who may manage them, by name only: a value is written, never shown) and users (a global admin creates
them, deactivates them, refreshes their tokens). Every change goes through the service the
API route calls, after that route's permission rule; what a user may not do is not shown, and refused
(403) when asked for all the same."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from corral.api.deps import ctx_of, forget_access
from corral.domain import access
from corral.schemas.requests import MemberSetting
from corral.services import accounts, members, secrets
from corral.services.errors import Forbidden, ServiceError
from corral.ui import auth
from corral.ui.render import page

ROLES = ("admin", "manager", "user")


def _one(form: dict[str, list[str]], name: str) -> str:
    return (form.get(name) or [""])[0].strip()


async def projects_list(request: Request) -> Response:
    s = await auth.require(request)
    ctx = ctx_of(request)
    found = await accounts.list_projects(ctx.db, s.user, include_not_joined=True)
    rows = []
    for p in found:
        ms = await accounts.project_members(ctx.db, p)
        mine = next((m.project_role for m in ms if m.user.id == s.user.id), None)
        rows.append(
            {
                "name": p.name,
                "owner": p.owner.name,
                "members": len(ms),
                "role": mine,
                "public": p.is_public,
                "created_at": p.created_at,
            }
        )
    return page(request, "projects.html", title="Projects", nav="projects", projects=rows)


async def project_page(request: Request) -> Response:
    s = await auth.require(request)
    ctx = ctx_of(request)
    project = await accounts.project_access(ctx.db, s.user, request.path_params["project"], "member_or_public")
    ms = await accounts.project_members(ctx.db, project)
    mine = next((m.project_role for m in ms if m.user.id == s.user.id), None)
    may_manage = access.may_reach("manager", s.user.global_role, mine, False)
    project_secrets: list[dict[str, object]] | None = None  # not shown: its forms answer 403 all the same
    if may_manage:  # the secrets routes' rules: ProjectManager, then dstack's _check_can_manage_secrets
        try:
            await secrets.require_manager(ctx, s.user, project)
            project_secrets = await secrets.list_secrets(ctx, project)
        except Forbidden:
            pass
    return page(
        request,
        "project.html",
        title=f"Project {project.name}",
        nav="projects",
        project=project,
        members=[{"name": m.user.name, "role": m.project_role} for m in ms],
        may_manage=may_manage,
        roles=ROLES,
        my_role=mine,
        secrets=project_secrets,
    )


async def secret_set(request: Request) -> Response:
    """Create a secret or give it a new value (``secrets/create_or_update``, its permission rule)."""
    s = await auth.require(request)
    form = await auth.form_of(request, s)
    ctx = ctx_of(request)
    project = await accounts.project_access(ctx.db, s.user, request.path_params["project"], "manager")
    await secrets.require_manager(ctx, s.user, project)
    name, value = _one(form, "name"), (form.get("value") or [""])[0]
    if not value:
        raise ServiceError("value: give the secret's value")
    await secrets.create_or_update(ctx, project, name, value, s.user)
    return RedirectResponse(f"/projects/{project.name}#secrets", status_code=303)


async def secret_delete(request: Request) -> Response:
    s = await auth.require(request)
    form = await auth.form_of(request, s)
    ctx = ctx_of(request)
    project = await accounts.project_access(ctx.db, s.user, request.path_params["project"], "manager")
    await secrets.require_manager(ctx, s.user, project)
    await secrets.delete(ctx, project, [_one(form, "name")], s.user)
    return RedirectResponse(f"/projects/{project.name}#secrets", status_code=303)


async def member_add(request: Request) -> Response:
    s = await auth.require(request)
    form = await auth.form_of(request, s)
    ctx = ctx_of(request)
    project = await accounts.project_access(ctx.db, s.user, request.path_params["project"], "manager_or_public")
    username, role = _one(form, "username"), _one(form, "role") or "user"
    if not username:
        raise ServiceError("username: give the name of the user to add")
    if role not in ROLES:
        raise ServiceError(f"role: one of {', '.join(ROLES)}")
    setting = MemberSetting.model_validate({"username": username, "project_role": role})
    await members.add_members(ctx.db, s.user, project, [setting])
    forget_access(request)
    return RedirectResponse(f"/projects/{project.name}", status_code=303)


async def member_remove(request: Request) -> Response:
    s = await auth.require(request)
    form = await auth.form_of(request, s)
    ctx = ctx_of(request)
    project = await accounts.project_access(ctx.db, s.user, request.path_params["project"], "member")
    username = _one(form, "username")
    if not username:
        raise ServiceError("username: give the name of the member to remove")
    await members.remove_members(ctx.db, s.user, project, [username])
    forget_access(request)
    if username == s.user.name:
        return RedirectResponse("/projects", status_code=303)
    return RedirectResponse(f"/projects/{project.name}", status_code=303)


async def users_list(request: Request) -> Response:
    s = await auth.require(request)
    accounts.require_admin(s.user)
    users = await accounts.list_users(ctx_of(request).db, s.user)
    return page(request, "users.html", title="Users", nav="users", users=users, roles=("admin", "user"))


async def user_create(request: Request) -> Response:
    s = await auth.require(request)
    accounts.require_admin(s.user)
    form = await auth.form_of(request, s)
    ctx = ctx_of(request)
    role = _one(form, "global_role") or "user"
    if role not in ("admin", "user"):
        raise ServiceError("global_role: admin or user")
    email = _one(form, "email") or None
    await accounts.create_user(ctx.db, _one(form, "username"), role, email, True, cipher=ctx.cipher(), actor=s.user)
    forget_access(request)
    return RedirectResponse("/users", status_code=303)


async def user_set_active(request: Request) -> Response:
    s = await auth.require(request)
    accounts.require_admin(s.user)
    form = await auth.form_of(request, s)
    ctx = ctx_of(request)
    name = request.path_params["username"]
    if name == s.user.name:
        raise ServiceError("You cannot deactivate yourself.")
    found = await accounts.get_user(ctx.db, s.user, name)
    active = _one(form, "active") == "1"
    await accounts.update_user(ctx.db, found.name, found.global_role, found.email, active, s.user)
    forget_access(request)
    return RedirectResponse("/users", status_code=303)


async def user_refresh_token(request: Request) -> Response:
    """A new token for the user (the old one and every UI session opened with it stop working). The new
    token is shown once, on the answer to this form, never in a URL."""
    s = await auth.require(request)
    form = await auth.form_of(request, s)
    ctx = ctx_of(request)
    name = request.path_params["username"]
    if s.user.global_role != "admin" and name != s.user.name:
        raise Forbidden()
    refreshed = await accounts.refresh_token(ctx.db, s.user, name, cipher=ctx.cipher())
    forget_access(request)
    del form
    if name == s.user.name:  # this session was bound to the old token: it has ended
        response = page(
            request,
            "token.html",
            title="New token",
            nav="users",
            username=name,
            token=ctx.reveal(refreshed.token),
            me=None,
            csrf="",
        )
        response.delete_cookie(auth.COOKIE, path="/", httponly=True, samesite="strict")
        return response
    return page(request, "token.html", title="New token", nav="users", username=name, token=ctx.reveal(refreshed.token))
