"""Project members as dstack 0.22.5 changes them: ``set_members``, ``add_members``, ``remove_members``.

The routes admit the caller (:mod:`corral.api.routes_accounts`); the rules on admins are dstack's
(:mod:`corral.domain.access`), answered with dstack's bodies: 403 ``"Access denied: ..."``, 400
``"Cannot remove all project admins"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from corral.domain import access
from corral.domain.events import project_target, user_target
from corral.domain.records import MemberRec, ProjectRec, UserRec
from corral.services.errors import AccessDenied, ServiceError
from corral.store import accounts as store
from corral.store import events
from corral.store.db import Database

if TYPE_CHECKING:
    from corral.schemas.requests import MemberSetting


def _denied(d: access.Denied | None) -> None:
    if d is None:
        return
    if d.status == 403:
        raise AccessDenied(d.msg)
    raise ServiceError(d.msg)


async def _resolve_members(conn: Any, members: Sequence[MemberSetting], strict: bool) -> list[tuple[str, str]]:
    """``(user_id, role)`` for each entry, matched by name or email; unknown users are skipped (``set_members``,
    as dstack) or an error (``add_members``)."""
    out: list[tuple[str, str]] = []
    for m in members:
        found = await _user(conn, m.username)
        if found is None:
            if strict:
                raise ServiceError(f"User not found: {m.username}")
            continue
        if m.project_role not in access.PROJECT_ROLES:
            raise ServiceError(f"Unknown project role {m.project_role!r}")
        out.append((found.id, m.project_role))
    return out


async def _user(conn: Any, name_or_email: str) -> UserRec | None:
    return await store.get_user(conn, name_or_email) or await store.get_user_by_email(conn, name_or_email)


async def set_members(db: Database, user: UserRec, project: ProjectRec, members: Sequence[MemberSetting]) -> None:
    """``set_members`` (the route admits managers): a manager may not change who the admins are."""
    async with db.write() as conn:
        current = await store.list_members(conn, project.id)
        role = next((m.project_role for m in current if m.user.id == user.id), None)
        _denied(
            access.check_set_members(
                user.global_role,
                role,
                [(m.username, m.project_role) for m in members],
                [(m.user.name, m.project_role) for m in current],
            )
        )
        await store.set_members(conn, project.id, await _resolve_members(conn, members, strict=False))
        await _record(conn, user, project, current)


async def add_members(db: Database, user: UserRec, project: ProjectRec, members: Sequence[MemberSetting]) -> None:
    """``add_members`` (the route admits managers, and anyone to a public project): managers add users and
    managers, admins add anyone, anyone joins a public project alone as ``user``."""
    async with db.write() as conn:
        before = await store.list_members(conn, project.id)
        role = await store.get_member_role(conn, project.id, user.id)
        _denied(
            access.check_add_members(
                user.global_role,
                user.name,
                user.email,
                role,
                project.is_public,
                [(m.username, m.project_role) for m in members],
            )
        )
        for user_id, new_role in await _resolve_members(conn, members, strict=True):
            await store.upsert_member(conn, project.id, user_id, new_role)
        await _record(conn, user, project, before)


async def remove_members(db: Database, user: UserRec, project: ProjectRec, usernames: list[str]) -> None:
    """``remove_members`` (the route admits any member): see :func:`corral.domain.access.check_remove_members`."""
    async with db.write() as conn:
        current = await store.list_members(conn, project.id)
        role_of = {m.user.id: m.project_role for m in current}
        removing: list[tuple[str, str | None]] = []
        ids = []
        for name in usernames:
            found = await _user(conn, name)
            if found is None:
                removing.append((name, "?"))
                continue
            removing.append((name, role_of.get(found.id)))
            ids.append(found.id)
        _denied(
            access.check_remove_members(
                user.global_role,
                user.name,
                user.email,
                role_of.get(user.id),
                removing,
                sum(1 for m in current if m.project_role == "admin"),
            )
        )
        await store.remove_members(conn, project.id, ids)
        await _record(conn, user, project, current)


async def _record(conn: Any, actor: UserRec, project: ProjectRec, before: list[MemberRec]) -> None:
    """One event per member added, removed or given another role (targets: the project and the user)."""
    after = {m.user.id: m for m in await store.list_members(conn, project.id)}
    old = {m.user.id: m for m in before}
    changes: list[tuple[UserRec, str]] = []
    for uid, m in after.items():
        was = old.get(uid)
        if was is None:
            changes.append((m.user, f"Project member added. Role: {m.project_role.upper()}"))
        elif was.project_role != m.project_role:
            changes.append(
                (m.user, f"Project member role changed {was.project_role.upper()} -> {m.project_role.upper()}")
            )
    changes += [(m.user, "Project member removed") for uid, m in old.items() if uid not in after]
    for who, message in changes:
        await events.emit(
            conn, message, actor.id, [project_target(project.id, project.name), user_target(who.id, who.name)]
        )
