"""What the in-server proxy asks of the database: a service's route (its ready replicas, ``auth``,
``strip_prefix``) and whether a token belongs to a member of the service's project. The proxy caches both;
these are its cache misses."""

from __future__ import annotations

from corral.context import Context
from corral.services import accounts, ui_sessions
from corral.services.errors import Forbidden, ProjectNotFound, ServiceError
from corral.store import service_replicas
from corral.store.service_replicas import Replica, Route

__all__ = ["Replica", "Route", "is_member", "models", "route", "session_member"]


async def route(ctx: Context, project_name: str, run_name: str) -> Route | None:
    async with ctx.db.read() as conn:
        return await service_replicas.route(conn, project_name, run_name)


async def models(ctx: Context, project_name: str) -> list[tuple[str, str, float]]:
    """The project's OpenAI models: ``(name, run name, submitted_at)`` (``/proxy/models/<project>/``)."""
    async with ctx.db.read() as conn:
        return await service_replicas.models(conn, project_name)


async def is_member(ctx: Context, token: str, project_name: str) -> bool:
    """Whether ``token`` is an active user who may use the project (dstack's ``is_project_member``)."""
    try:
        user = await accounts.authenticate(ctx.db, token)
        await accounts.project_access(ctx.db, user, project_name, "member")
    except (Forbidden, ProjectNotFound, ServiceError):
        return False
    return True


async def session_member(ctx: Context, session_id: str, csrf: str, project_name: str) -> bool:
    """Whether the web UI's session ``session_id``, with its CSRF token ``csrf`` (which only the UI's own
    pages hold), is a user who may use the project: how the UI's model playground calls the model endpoint
    with the browser's session rather than a token typed in the page."""
    if not session_id or not ui_sessions.csrf_ok(session_id, csrf):
        return False
    user = await ui_sessions.resolve(ctx.db, session_id)
    if user is None:
        return False
    try:
        await accounts.project_access(ctx.db, user, project_name, "member")
    except (Forbidden, ProjectNotFound):
        return False
    return True
