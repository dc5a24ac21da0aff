"""Inserts deferred to the end of a write transaction: rows many statements of one transaction add to the same
table (its events and their targets) go in one multi-row statement per table, just before the commit, instead
of a round trip each.

``Database.write`` opens the buffer and flushes it; :func:`insert` adds rows to it (or, on a connection without
one, inserts them at once). A savepoint that rolls back drops the rows added since it began (:func:`mark`,
:func:`drop_since`), so a rejected gang of ``plan_apply`` leaves none. Rows keep the order they were added in,
and a table's rows are inserted before those of a table first added after it (events before their targets).

Imports sqlalchemy only.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

#: Connection -> the (statement, row) pairs added to its open write transaction, in order.
_BUFFERS: weakref.WeakKeyDictionary[AsyncConnection, list[tuple[sa.Insert, Mapping[str, Any]]]] = (
    weakref.WeakKeyDictionary()
)


def open_buffer(conn: AsyncConnection) -> None:
    """Defer ``conn``'s inserts from now until :func:`flush`."""
    _BUFFERS[conn] = []


def close_buffer(conn: AsyncConnection) -> None:
    """Forget what is still deferred (the transaction rolled back)."""
    _BUFFERS.pop(conn, None)


async def insert(conn: AsyncConnection, stmt: sa.Insert, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert ``rows`` with ``stmt`` (one and the same statement object per table) at the end of ``conn``'s
    transaction, or now where it defers nothing."""
    if not rows:
        return
    buffer = _BUFFERS.get(conn)
    if buffer is None:
        await conn.execute(stmt, list(rows) if len(rows) > 1 else rows[0])
        return
    buffer.extend((stmt, row) for row in rows)


def mark(conn: AsyncConnection) -> int:
    """Where ``conn``'s buffer stands now (for :func:`drop_since`)."""
    buffer = _BUFFERS.get(conn)
    return len(buffer) if buffer is not None else 0


def drop_since(conn: AsyncConnection, at: int) -> None:
    """Drop the rows added since :func:`mark` said ``at`` (a savepoint rolled back)."""
    buffer = _BUFFERS.get(conn)
    if buffer is not None:
        del buffer[at:]


async def flush(conn: AsyncConnection) -> None:
    """Insert what is deferred: one statement per table, tables in the order they were first added to."""
    buffer = _BUFFERS.get(conn)
    if not buffer:
        return
    _BUFFERS[conn] = []
    by_stmt: dict[int, tuple[sa.Insert, list[Mapping[str, Any]]]] = {}
    for stmt, row in buffer:
        by_stmt.setdefault(id(stmt), (stmt, []))[1].append(row)
    for stmt, rows in by_stmt.values():
        await conn.execute(stmt, rows if len(rows) > 1 else rows[0])
