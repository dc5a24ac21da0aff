"""Projects' secrets (dstack's ``secrets/*``): rows of ``secrets``, one per project and name, whose value
is stored as given (the service seals it with the server key before it gets here and opens it after).

Imports: the tables only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store.tables import secrets


@dataclass(frozen=True)
class SecretRec:
    id: str
    project_id: str
    name: str
    #: As stored: sealed (``enc:v1:...``).
    value: str
    created_at: float
    updated_at: float


def _rec(row: sa.Row[tuple[object, ...]]) -> SecretRec:
    m = row._mapping
    return SecretRec(
        id=m["id"],
        project_id=m["project_id"],
        name=m["name"],
        value=m["value"],
        created_at=m["created_at"],
        updated_at=m["updated_at"],
    )


async def list_secrets(conn: AsyncConnection, project_id: str) -> list[SecretRec]:
    """The project's secrets, newest first (as dstack lists them)."""
    rows = await conn.execute(
        sa.select(secrets).where(secrets.c.project_id == project_id).order_by(secrets.c.created_at.desc(), secrets.c.id)
    )
    return [_rec(r) for r in rows]


async def get_by_names(conn: AsyncConnection, project_id: str, names: Sequence[str]) -> list[SecretRec]:
    if not names:
        return []
    rows = await conn.execute(
        sa.select(secrets).where(secrets.c.project_id == project_id, secrets.c.name.in_(list(names)))
    )
    return [_rec(r) for r in rows]


async def get_secret(conn: AsyncConnection, project_id: str, name: str) -> SecretRec | None:
    found = await get_by_names(conn, project_id, [name])
    return found[0] if found else None


async def names_of(conn: AsyncConnection, project_id: str, names: Sequence[str]) -> set[str]:
    """Which of ``names`` the project has (no value read)."""
    if not names:
        return set()
    rows = await conn.execute(
        sa.select(secrets.c.name).where(secrets.c.project_id == project_id, secrets.c.name.in_(list(names)))
    )
    return set(rows.scalars())


async def insert_secret(conn: AsyncConnection, rec: SecretRec) -> None:
    await conn.execute(
        sa.insert(secrets).values(
            id=rec.id,
            project_id=rec.project_id,
            name=rec.name,
            value=rec.value,
            created_at=rec.created_at,
            updated_at=rec.updated_at,
        )
    )


async def update_value(conn: AsyncConnection, secret_id: str, value: str, now: float) -> None:
    await conn.execute(sa.update(secrets).where(secrets.c.id == secret_id).values(value=value, updated_at=now))


async def delete_secrets(conn: AsyncConnection, ids: Sequence[str]) -> None:
    if ids:
        await conn.execute(sa.delete(secrets).where(secrets.c.id.in_(list(ids))))
