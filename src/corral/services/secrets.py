"""Projects' secrets, as dstack 0.22.5's ``secrets/list|get|create_or_update|delete`` have them, and what the
rest of the server needs of them: which exist (``runs/apply`` refuses a reference to a missing one) and
their values in clear for the jobs worker, which fills them in only when a job is sent to its host.

Who may manage them is dstack's ``_check_can_manage_secrets``: global admins, project admins, and project
managers when the server's ``config.yml`` sets ``default_permissions.allow_managers_manage_secrets``.
Values are sealed with the server key (:mod:`corral.store.encryption`) before they are written and are
never logged; a name is dstack's ``^[A-Za-z0-9-_]{1,200}$``, a value at most 5000 characters.
"""

from __future__ import annotations

import re
import time
import uuid
import zlib
from collections.abc import Sequence
from typing import Any

from corral.context import Context
from corral.domain import access
from corral.domain.events import secret_target
from corral.domain.records import ProjectRec, UserRec
from corral.services.errors import AccessDenied, ResourceNotExists, ServiceError
from corral.store import accounts as account_store
from corral.store import events
from corral.store import secrets as store
from corral.store.encryption import Cipher, open_sealed

NAME_REGEX = "^[A-Za-z0-9-_]{1,200}$"
_NAME = re.compile(NAME_REGEX)
VALUE_MAX_LENGTH = 5000
_LOCK = 0x73656372  # "secr": create_or_update of one project's secrets, one at a time on Postgres


async def require_manager(ctx: Context, user: UserRec, project: ProjectRec) -> None:
    """dstack's ``_check_can_manage_secrets``: 403 ``Access denied`` unless the caller may."""
    if user.global_role == "admin":
        return
    async with ctx.db.read() as conn:
        role = await account_store.get_member_role(conn, project.id, user.id)
    if not access.can_manage_secrets(user.global_role, role, ctx.managers_manage_secrets):
        raise AccessDenied()


def _wire(rec: store.SecretRec, value: str | None) -> dict[str, Any]:
    return {"id": rec.id, "name": rec.name, "value": value}


async def list_secrets(ctx: Context, project: ProjectRec) -> list[dict[str, Any]]:
    async with ctx.db.read() as conn:
        found = await store.list_secrets(conn, project.id)
    return [_wire(s, None) for s in found]


async def get_secret(ctx: Context, project: ProjectRec, name: str) -> dict[str, Any]:
    async with ctx.db.read() as conn:
        found = await store.get_secret(conn, project.id, name)
    if found is None:
        raise ResourceNotExists("Resource not found")
    return _wire(found, open_sealed(ctx.cipher, found.value))


def validate(name: str, value: str) -> None:
    if _NAME.match(name) is None:
        raise ServiceError(f"Secret name should match regex '{NAME_REGEX}")
    if len(value) > VALUE_MAX_LENGTH:
        raise ServiceError(f"Secret value length must not exceed {VALUE_MAX_LENGTH}")


async def create_or_update(
    ctx: Context, project: ProjectRec, name: str, value: str, user: UserRec | None = None
) -> tuple[dict[str, Any], str]:
    """The secret as answered (with its value) and what happened: ``created``, ``updated`` (the value
    changed) or ``unchanged`` -- recorded as the events ``Secret created`` and ``Secret updated`` (none when
    unchanged, as in dstack) in the same transaction."""
    actor = user.id if user else None
    validate(name, value)
    cipher = ctx.cipher()
    sealed = cipher.encrypt(value)
    now = time.time()
    async with ctx.db.write() as conn:
        await ctx.db.serialize(conn, _LOCK ^ zlib.crc32(project.id.encode()))
        found = await store.get_secret(conn, project.id, name)
        if found is None:
            rec = store.SecretRec(str(uuid.uuid4()), project.id, name, sealed, now, now)
            await store.insert_secret(conn, rec)
            await events.emit(conn, "Secret created", actor, [secret_target(project.id, rec.id, name)])
            return _wire(rec, value), "created"
        if _opened(cipher, found.value) == value:
            return _wire(found, value), "unchanged"
        await store.update_value(conn, found.id, sealed, now)
        await events.emit(conn, "Secret updated", actor, [secret_target(project.id, found.id, name)])
        return _wire(found, value), "updated"


def _opened(cipher: Cipher, stored: str) -> str:
    return open_sealed(lambda: cipher, stored)


async def delete(
    ctx: Context, project: ProjectRec, names: Sequence[str], user: UserRec | None = None
) -> list[dict[str, Any]]:
    """Delete every secret named (all or none: a name not found is a 400 listing the missing ones)."""
    async with ctx.db.write() as conn:
        found = await store.get_by_names(conn, project.id, names)
        missing = sorted(set(names) - {s.name for s in found})
        if missing:
            raise ResourceNotExists(f"Secrets not found: {', '.join(missing)}")
        await store.delete_secrets(conn, [s.id for s in found])
        for s in found:
            await events.emit(
                conn, "Secret deleted", user.id if user else None, [secret_target(project.id, s.id, s.name)]
            )
    return [_wire(s, None) for s in found]


async def existing_names(ctx: Context, project_id: str, names: Sequence[str]) -> set[str]:
    async with ctx.db.read() as conn:
        return await store.names_of(conn, project_id, names)
