"""One-time facts about this database (``server_state``: key -> value), e.g. that a start-up pass which
need run only once per database has run, so that later starts skip it without reading what it read.

Imports: the tables only.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store.tables import server_state


async def get_state(conn: AsyncConnection, key: str) -> str | None:
    row = await conn.execute(sa.select(server_state.c.value).where(server_state.c.key == key))
    return row.scalar_one_or_none()


async def set_state(conn: AsyncConnection, key: str, value: str, now: float) -> None:
    """Record ``key`` (inside the caller's write transaction: it commits with the work it records)."""
    done = await conn.execute(
        sa.update(server_state).where(server_state.c.key == key).values(value=value, updated_at=now)
    )
    if done.rowcount == 0:
        await conn.execute(sa.insert(server_state).values(key=key, value=value, updated_at=now))
