"""What the in-server proxy asks of the database: a service's route (its ready replicas, ``auth``,
``strip_prefix``) and whether a token belongs to a member of the service's project. The proxy caches both;
these are its cache misses."""

from __future__ import annotations

from corral.context import Context
from corral.services import accounts
from corral.services.errors import Forbidden, ProjectNotFound, ServiceError
from corral.store import service_replicas
from corral.store.service_replicas import Replica, Route

__all__ = ["Replica", "Route", "is_member", "models", "route"]


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
