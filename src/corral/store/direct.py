"""Statements built once (``store/prebuilt.py``) run on SQLite by its driver itself, in the caller's transaction.

SQLAlchemy's execution path costs more than SQLite's work for the short statements every job runs (a trivial
``SELECT`` by id, built once, about 46 µs of CPU, most of it before SQLite does anything: the execution context,
the parameters, the result rows, a greenlet switch per driver call). :func:`execute` compiles a statement once
for the connection's dialect, keeps its text, the order of its parameters and its columns' type processors,
and on SQLite hands the text and values to aiosqlite's connection (made in place: ``store/sqlite_inline.py``);
its answer (:class:`Rows`) has the rows as named tuples (attributes, ``_mapping``) and the rowcount. Postgres,
and a statement this cannot run as compiled (an expanding ``IN``, a value rendered at execution, a default or
``onupdate`` SQLAlchemy computes at execution), go through SQLAlchemy as before, so the caller reads either answer
alike. A broken constraint or another database error raises as SQLAlchemy raises it (``Database.write`` makes a
unique key taken meanwhile a ``Conflict``).

:func:`insert` does the same for inserts of whole rows (a column left out takes its default, as SQLAlchemy
gives it).

Imports sqlalchemy only.
"""

from __future__ import annotations

import sqlite3
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection

Processor = Callable[[Any], Any]


@dataclass(frozen=True)
class _Compiled:
    """A statement as SQLite's driver runs it."""

    sql: str
    #: Each positional parameter: its name, its value when the caller gives none, and its type's processor.
    params: tuple[tuple[str, Any, Processor | None], ...]
    #: The result's row type (None: the statement returns no rows), and each column's processor (by index).
    row: type | None
    results: tuple[tuple[int, Processor], ...]


class Rows:
    """The answer of :func:`execute` on SQLite, read as SQLAlchemy's result is read."""

    __slots__ = ("_rows", "rowcount")

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self._rows = rows
        self.rowcount = rowcount

    def first(self) -> Any:
        return self._rows[0] if self._rows else None

    def all(self) -> list[Any]:
        return self._rows

    def scalar_one(self) -> Any:
        if len(self._rows) != 1:
            raise sa.exc.NoResultFound("expected one row") if not self._rows else sa.exc.MultipleResultsFound()
        return self._rows[0][0]

    def __iter__(self) -> Any:
        return iter(self._rows)


#: id(statement) -> (the statement, kept alive so that its id is not reused; its compiled form, None: through
#: SQLAlchemy). Statements given here are built once (``store/prebuilt.py``), so this stays small.
_COMPILED: dict[int, tuple[sa.Executable, _Compiled | None]] = {}


def _row_type(names: Sequence[str]) -> type:
    base = namedtuple("Row", names, rename=True)  # type: ignore[misc]
    return type("Row", (base,), {"__slots__": (), "_mapping": property(lambda self: self._asdict())})


def _compile(stmt: sa.Executable, dialect: Dialect) -> _Compiled | None:
    compiled: Any = stmt.compile(dialect=dialect)  # type: ignore[attr-defined]  # every statement given here has it
    names = compiled.positiontup
    if names is None or compiled.literal_execute_params or compiled.post_compile_params:
        return None  # rendered again at each execution: SQLAlchemy's
    if compiled.insert_prefetch or compiled.update_prefetch:
        return None  # a default or onupdate computed by SQLAlchemy at execution: SQLAlchemy's
    params = []
    for name in names:
        bind = compiled.binds[name]
        if bind.expanding or bind.callable is not None:
            return None
        default = _REQUIRED if bind.required else bind.effective_value
        params.append((name, default, bind.type.dialect_impl(dialect).bind_processor(dialect)))
    columns = list(getattr(stmt, "exported_columns", ()))  # a SELECT's, or what an UPDATE returns
    row = _row_type([c.key for c in columns]) if columns else None
    results = []
    for i, column in enumerate(columns):
        processor = column.type.dialect_impl(dialect).result_processor(dialect, None)
        if processor is not None:
            results.append((i, processor))
    return _Compiled(compiled.string, tuple(params), row, tuple(results))


_REQUIRED = object()


def _compiled(stmt: sa.Executable, dialect: Dialect) -> _Compiled | None:
    known = _COMPILED.get(id(stmt))
    if known is None or known[0] is not stmt:
        known = _COMPILED[id(stmt)] = (stmt, _compile(stmt, dialect))
    return known[1]


def driver(conn: AsyncConnection) -> Any:
    """aiosqlite's connection under ``conn``, which is in a transaction."""
    assert conn.sync_connection is not None
    return conn.sync_connection.connection.driver_connection


async def execute(conn: AsyncConnection, stmt: sa.Executable, params: Mapping[str, Any] | None = None) -> Any:
    """``stmt`` (built once) run with ``params`` in ``conn``'s transaction: on SQLite by its driver (a
    :class:`Rows`), elsewhere by SQLAlchemy (its result)."""
    if conn.dialect.name != "sqlite":
        return await conn.execute(stmt, params)
    compiled = _compiled(stmt, conn.dialect)
    if compiled is None:
        return await conn.execute(stmt, params)
    given = params or {}
    values = []
    for name, default, process in compiled.params:
        value = given[name] if default is _REQUIRED else given.get(name, default)
        values.append(process(value) if process is not None and value is not None else value)
    try:
        if compiled.row is None:
            cursor = await driver(conn).execute(compiled.sql, values)
            return Rows([], cursor.rowcount)
        rows = await driver(conn).execute_fetchall(compiled.sql, values)
    except sqlite3.Error as e:
        raise _wrapped(compiled.sql, values, e) from e
    make, results = compiled.row._make, compiled.results  # type: ignore[attr-defined]
    if results:
        rows = [_processed(row, results) for row in rows]
    return Rows([make(row) for row in rows], len(rows))


def _processed(row: Sequence[Any], results: tuple[tuple[int, Processor], ...]) -> list[Any]:
    out = list(row)
    for i, process in results:
        out[i] = process(out[i])
    return out


def _wrapped(sql: str, values: Sequence[Any], e: sqlite3.Error) -> sa.exc.StatementError:
    """SQLAlchemy's exception for a driver's error (``IntegrityError`` for a broken constraint, ...)."""
    return sa.exc.DBAPIError.instance(sql, list(values), e, sqlite3.Error)


#: (table, columns) -> SQLite's INSERT of those columns.
_INSERTS: dict[tuple[str, tuple[str, ...]], str] = {}


#: table -> its columns' scalar defaults (key, value), and the keys of those SQLAlchemy computes, in column order.
_DEFAULTS: dict[sa.Table, tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]] = {}


def _defaults_of(table: sa.Table) -> tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]:
    found = _DEFAULTS.get(table)
    if found is None:
        with_default = [c for c in table.c if c.default is not None]
        scalars = tuple((c.key, c.default.arg) for c in with_default if c.default.is_scalar)  # type: ignore[union-attr]
        computed = tuple(c.key for c in with_default if not c.default.is_scalar)  # type: ignore[union-attr]
        found = _DEFAULTS[table] = (scalars, computed)
    return found


def _defaults(table: sa.Table, row: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` with the scalar defaults of the columns it leaves out (as SQLAlchemy's insert gives them)."""
    scalars, computed = _defaults_of(table)
    for key in computed:
        if key not in row:  # computed by SQLAlchemy at execution: a statement of its own is needed
            raise TypeError(f"{table.name}.{key}: its default is not a value; give it in the row")
    out = dict(row)
    for key, value in scalars:
        if key not in out:
            out[key] = value
    return out


async def insert(conn: AsyncConnection, table: sa.Table, stmt: sa.Insert, rows: Sequence[Mapping[str, Any]]) -> None:
    """``rows`` inserted into ``table`` in ``conn``'s transaction, in one statement per set of columns: on SQLite
    by its driver (rows of plain values: text, numbers, booleans, None), elsewhere by ``stmt`` (``table``'s insert,
    built once)."""
    if not rows:
        return
    if conn.dialect.name != "sqlite":
        await conn.execute(stmt, list(rows) if len(rows) > 1 else rows[0])
        return
    await driver_insert(conn, table, [_defaults(table, row) for row in rows])


async def driver_insert(conn: AsyncConnection, table: sa.TableClause, rows: Sequence[Mapping[str, Any]]) -> None:
    """SQLite: ``rows`` (plain values, every column named) inserted into ``table`` by the driver itself, one
    statement per set of columns."""
    groups: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row), []).append(row)
    for columns, group in groups.items():
        sql = _INSERTS.get((table.name, columns))
        if sql is None:
            names = ", ".join(table.c[c].name for c in columns)  # a column the table lacks: KeyError
            sql = _INSERTS[(table.name, columns)] = (
                f"INSERT INTO {table.name} ({names}) VALUES ({', '.join('?' * len(columns))})"
            )
        await executemany(conn, sql, [tuple(row[c] for c in columns) for row in group])


async def executemany(conn: AsyncConnection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """SQLite: ``sql`` (``?`` parameters) run for each of ``rows`` by the driver itself, in ``conn``'s
    transaction; an error raises as SQLAlchemy raises it."""
    try:
        await driver(conn).executemany(sql, rows)
    except sqlite3.Error as e:
        raise _wrapped(sql, [], e) from e
