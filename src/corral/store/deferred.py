"""Inserts and counts deferred to the end of a write transaction: rows many statements of one transaction add to
the same table (its events and their targets) go in one multi-row statement per table, just before the commit,
instead of a round trip each; additions to kept counts (``store/run_counts.py``) are summed per key and written
then too, every counter in one order (by its name, then its keys), so that on Postgres two transactions lock the
count rows they share in the same order, and only for the moment before their commits.

``Database.write`` opens the buffer and flushes it; :func:`insert` adds rows to it and :func:`count` counts
(or, on a connection without one, they are written at once). A savepoint that rolls back drops what was added
since it began (:func:`mark`, :func:`drop_since`), so a rejected gang of ``plan_apply`` leaves no row and counts
nothing. Rows keep the order they were added in, and a table's rows are inserted before those of a table first
added after it (events before their targets). On SQLite the rows go by the driver itself (``store/direct.py``).

Imports sqlalchemy and ``store/direct.py`` only.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store import direct

#: Connection -> the (statement, row) pairs added to its open write transaction, in order.
_BUFFERS: weakref.WeakKeyDictionary[AsyncConnection, list[tuple[sa.Insert, Mapping[str, Any]]]] = (
    weakref.WeakKeyDictionary()
)


@dataclass(frozen=True)
class Counter:
    """Kept counts: ``write`` adds the summed deltas (no zero among them) to the rows of their keys, in the
    order given (sorted)."""

    name: str
    write: Callable[[AsyncConnection, Sequence[tuple[tuple[str, ...], int]]], Awaitable[None]]


#: Connection -> the (counter, key, delta) additions of its open write transaction, in order.
_TALLIES: weakref.WeakKeyDictionary[AsyncConnection, list[tuple[Counter, tuple[str, ...], int]]] = (
    weakref.WeakKeyDictionary()
)


def open_buffer(conn: AsyncConnection) -> None:
    """Defer ``conn``'s inserts and counts from now until :func:`flush`."""
    _BUFFERS[conn] = []
    _TALLIES[conn] = []


def close_buffer(conn: AsyncConnection) -> None:
    """Forget what is still deferred (the transaction rolled back)."""
    _BUFFERS.pop(conn, None)
    _TALLIES.pop(conn, None)


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


async def count(conn: AsyncConnection, counter: Counter, key: tuple[str, ...], delta: int) -> None:
    """Add ``delta`` to ``counter``'s count of ``key`` at the end of ``conn``'s transaction, or now where it
    defers nothing."""
    tallies = _TALLIES.get(conn)
    if tallies is None:
        if delta:
            await counter.write(conn, [(key, delta)])
        return
    tallies.append((counter, key, delta))


def mark(conn: AsyncConnection) -> tuple[int, int]:
    """Where ``conn``'s buffers stand now (for :func:`drop_since`)."""
    buffer, tallies = _BUFFERS.get(conn), _TALLIES.get(conn)
    return (len(buffer) if buffer is not None else 0, len(tallies) if tallies is not None else 0)


def drop_since(conn: AsyncConnection, at: tuple[int, int]) -> None:
    """Drop the rows and counts added since :func:`mark` said ``at`` (a savepoint rolled back)."""
    buffer, tallies = _BUFFERS.get(conn), _TALLIES.get(conn)
    if buffer is not None:
        del buffer[at[0] :]
    if tallies is not None:
        del tallies[at[1] :]


async def flush(conn: AsyncConnection) -> None:
    """Insert what is deferred: one statement per table, tables in the order they were first added to; then
    the counts, summed, counter by counter (by name) and key by key (sorted)."""
    await _flush_inserts(conn)
    tallies = _TALLIES.get(conn)
    if not tallies:
        return
    _TALLIES[conn] = []
    sums: dict[str, dict[tuple[str, ...], int]] = {}
    counters: dict[str, Counter] = {}
    for counter, key, delta in tallies:
        counters[counter.name] = counter
        by_key = sums.setdefault(counter.name, {})
        by_key[key] = by_key.get(key, 0) + delta
    for name in sorted(sums):
        changes = sorted((key, delta) for key, delta in sums[name].items() if delta)
        if changes:
            await counters[name].write(conn, changes)


async def _flush_inserts(conn: AsyncConnection) -> None:
    buffer = _BUFFERS.get(conn)
    if not buffer:
        return
    _BUFFERS[conn] = []
    by_stmt: dict[int, tuple[sa.Insert, list[Mapping[str, Any]]]] = {}
    for stmt, row in buffer:
        by_stmt.setdefault(id(stmt), (stmt, []))[1].append(row)
    for stmt, rows in by_stmt.values():
        if conn.dialect.name == "sqlite":
            # plain values (text, numbers, None: events and their targets) that need none of SQLAlchemy's
            # processing, whose execution path cost more than SQLite's insert (a transaction recording three
            # events: 0.30 -> 0.21 ms of CPU); rows naming other columns go in a statement of their own
            await direct.driver_insert(conn, stmt.table, rows)
        else:
            await conn.execute(stmt, rows if len(rows) > 1 else rows[0])


async def driver_executemany(conn: AsyncConnection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """SQLite: ``sql`` (``?`` parameters) run for each of ``rows`` by the driver itself, in ``conn``'s
    transaction; a broken constraint raises as SQLAlchemy raises it (``Database.write`` makes it a Conflict)."""
    await direct.executemany(conn, sql, rows)
