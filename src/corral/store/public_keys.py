"""Users' public SSH keys (``users/public_keys/*``): list, add (one per user and fingerprint), delete."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store.tables import user_public_keys


@dataclass(frozen=True)
class PublicKeyRec:
    id: str
    user_id: str
    created_at: float
    name: str
    type: str
    fingerprint: str
    key: str


def _rec(row: sa.Row[tuple[object, ...]]) -> PublicKeyRec:
    m = row._mapping
    return PublicKeyRec(
        id=m["id"],
        user_id=m["user_id"],
        created_at=m["created_at"],
        name=m["name"],
        type=m["type"],
        fingerprint=m["fingerprint"],
        key=m["key"],
    )


async def list_keys(conn: AsyncConnection, user_id: str) -> list[PublicKeyRec]:
    rows = await conn.execute(
        sa.select(user_public_keys)
        .where(user_public_keys.c.user_id == user_id)
        .order_by(user_public_keys.c.created_at.desc(), user_public_keys.c.id)
    )
    return [_rec(r) for r in rows]


async def has_fingerprint(conn: AsyncConnection, user_id: str, fingerprint: str) -> bool:
    q = sa.select(user_public_keys.c.id).where(
        user_public_keys.c.user_id == user_id, user_public_keys.c.fingerprint == fingerprint
    )
    return (await conn.execute(q)).first() is not None


async def insert_key(conn: AsyncConnection, rec: PublicKeyRec) -> None:
    await conn.execute(sa.insert(user_public_keys).values(**rec.__dict__))


async def delete_keys(conn: AsyncConnection, user_id: str, ids: Sequence[str]) -> None:
    await conn.execute(
        sa.delete(user_public_keys).where(user_public_keys.c.user_id == user_id, user_public_keys.c.id.in_(list(ids)))
    )


async def delete_user_keys(conn: AsyncConnection, user_ids: Sequence[str]) -> None:
    await conn.execute(sa.delete(user_public_keys).where(user_public_keys.c.user_id.in_(list(user_ids))))
