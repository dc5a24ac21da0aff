"""Leases on rows that workers process: claim (owner, token, expiry), extend, release.

A worker writes its result only while its token still matches (``guard``), so a stale worker --
one whose lease expired and was taken over, e.g. after a replica was killed -- writes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store.unindexed import unindexed


async def claim(
    conn: AsyncConnection,
    table: sa.Table,
    row_id: str,
    owner: str,
    now: float,
    ttl: float,
    expect_status: tuple[str, ...] | None = None,
) -> str | None:
    """A lease on the row, if nobody holds a live one -- and, with ``expect_status``, only while the row
    is still in the state the caller's (possibly stale) read saw; otherwise the work was already done."""
    token = str(uuid.uuid4())
    q = (
        sa.update(table)
        .where(table.c.id == row_id)
        .where(sa.or_(table.c.lock_expires_at.is_(None), table.c.lock_expires_at < now))
    )
    if expect_status is not None:
        q = q.where(table.c.status.in_(expect_status))
    res = await conn.execute(q.values(lock_owner=owner, lock_token=token, lock_expires_at=now + ttl))
    return token if res.rowcount > 0 else None


async def claim_many(
    conn: AsyncConnection,
    table: sa.Table,
    row_ids: Sequence[str],
    owner: str,
    now: float,
    ttl: float,
    expect_status: tuple[str, ...] | None = None,
) -> dict[str, str]:
    """``claim`` for many rows in two statements (one token for the batch): row id -> token of each row
    claimed. A row held by a live lease, or no longer in ``expect_status``, is left out."""
    if not row_ids:
        return {}
    token = str(uuid.uuid4())
    q = claim_many_statement(table, row_ids, now, expect_status)
    res = await conn.execute(q.values(lock_owner=owner, lock_token=token, lock_expires_at=now + ttl))
    if res.rowcount == 0:
        return {}
    rows = await conn.execute(sa.select(table.c.id).where(table.c.id.in_(list(row_ids)), table.c.lock_token == token))
    return {row_id: token for (row_id,) in rows}


def claim_many_statement(
    table: sa.Table, row_ids: Sequence[str], now: float, expect_status: tuple[str, ...] | None
) -> sa.Update:
    """:func:`claim_many`'s UPDATE, without its values: the rows of ``row_ids`` found by their ids (their status
    checked, ``unindexed``: not read from the status's index, every row of that status)."""
    q = (
        sa.update(table)
        .where(table.c.id.in_(list(row_ids)))
        .where(sa.or_(table.c.lock_expires_at.is_(None), table.c.lock_expires_at < now))
    )
    if expect_status is not None:
        q = q.where(unindexed(table.c.status).in_(expect_status))
    return q


_EXTENDS: dict[str, sa.Update] = {}
_RELEASES: dict[str, sa.Update] = {}


def _guarded(table: sa.Table) -> sa.Update:
    return sa.update(table).where(table.c.id == sa.bindparam("_id"), table.c.lock_token == sa.bindparam("_token"))


async def extend(conn: AsyncConnection, table: sa.Table, row_id: str, token: str, now: float, ttl: float) -> bool:
    stmt = _EXTENDS.get(table.name)
    if stmt is None:  # built once per table (store/prebuilt.py says why)
        stmt = _EXTENDS[table.name] = _guarded(table).values(lock_expires_at=sa.bindparam("_until"))
    res = await conn.execute(stmt, {"_id": row_id, "_token": token, "_until": now + ttl})
    return res.rowcount > 0


async def release(conn: AsyncConnection, table: sa.Table, row_id: str, token: str) -> bool:
    stmt = _RELEASES.get(table.name)
    if stmt is None:
        stmt = _RELEASES[table.name] = _guarded(table).values(lock_owner=None, lock_token=None, lock_expires_at=None)
    res = await conn.execute(stmt, {"_id": row_id, "_token": token})
    return res.rowcount > 0


def guard(table: sa.Table, row_id: str, token: str) -> sa.ColumnElement[bool]:
    return sa.and_(table.c.id == row_id, table.c.lock_token == token)
