"""The web UI's login sessions (table ``ui_sessions``): created, resolved to their user, deleted.

A session row keeps the SHA-256 of its random id (the id itself lives only in the browser's cookie) and the
token hash its user had at login: the session resolves only while the user's token is still that one, so
``users/refresh_token`` ends every session of the user without touching this table.
"""

from __future__ import annotations

import hashlib

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.records import UserRec
from corral.store.accounts import _user
from corral.store.tables import ui_sessions, users


def session_hash(session_id: str) -> str:
    return hashlib.sha256(b"corral-ui-session:" + session_id.encode()).hexdigest()


async def create(
    conn: AsyncConnection, session_id: str, user: UserRec, token_hash: str, now: float, ttl: float
) -> None:
    await conn.execute(
        ui_sessions.insert().values(
            id_hash=session_hash(session_id),
            user_id=user.id,
            token_hash=token_hash,
            created_at=now,
            expires_at=now + ttl,
        )
    )
    # a user's expired sessions go when they log in again (no sweeper needed)
    await conn.execute(ui_sessions.delete().where(ui_sessions.c.user_id == user.id, ui_sessions.c.expires_at <= now))


async def resolve(conn: AsyncConnection, session_id: str, now: float) -> UserRec | None:
    """The session's user, if the session exists, has not expired, and the user is active, not deleted, and
    still holds the token the session was opened with."""
    row = (
        await conn.execute(
            sa.select(users)
            .join(ui_sessions, ui_sessions.c.user_id == users.c.id)
            .where(
                ui_sessions.c.id_hash == session_hash(session_id),
                ui_sessions.c.expires_at > now,
                ui_sessions.c.token_hash == users.c.token_hash,
                users.c.deleted == sa.false(),
                users.c.active.is_(True),
            )
        )
    ).first()
    return _user(row) if row is not None else None


async def delete(conn: AsyncConnection, session_id: str) -> None:
    await conn.execute(ui_sessions.delete().where(ui_sessions.c.id_hash == session_hash(session_id)))
