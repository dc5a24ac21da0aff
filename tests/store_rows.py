"""Rows the store and worker tests start from, inserted directly: an admin user ``u`` and its project ``p``
(``main``)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store.tables import projects, users


async def admin_and_project(conn: AsyncConnection, now: float) -> None:
    """User ``u`` (a global admin, ``admin``) and project ``p`` (``main``, owned by ``u``, no backends)."""
    await conn.execute(
        sa.insert(users).values(
            id="u", name="admin", token="t", token_hash="h", global_role="admin", active=True, deleted=False,
            created_at=now,
        )
    )  # fmt: skip
    await conn.execute(
        sa.insert(projects).values(
            id="p", name="main", owner_id="u", created_at=now, is_public=False, deleted=False, backends="[]"
        )
    )
