"""Statements built once and reused: the hot paths' SELECTs and UPDATEs of one row by its id, with their values
as bound parameters.

Building a SQLAlchemy statement and deriving its cache key costs more than running it on SQLite (measured: an
UPDATE of one job by id, built per call, about 195 µs of CPU; the same statement built once, about 65 µs): the
statements every job's start and end run are built here once per table and set of columns, and executed with
their parameters. The parameter of the row's id is ``_id``, of the statuses it must be in ``_expect_0``,
``_expect_1``, ... (one each: a statement per number of statuses, sent as compiled, where an expanding ``IN``
parameter had SQLAlchemy render the statement's text again at every execution, about 18 µs of CPU), of a
column's new value ``_v_<column>``.

Imports sqlalchemy only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

ID = "_id"
EXPECT = "_expect"


def params(row_id: str, values: Mapping[str, Any], expect: Sequence[str] | None = None) -> dict[str, Any]:
    """The parameters of :func:`update_by_id`'s and :func:`select_by_id`'s statements."""
    out: dict[str, Any] = {f"_v_{k}": v for k, v in values.items()}
    out[ID] = row_id
    for i, status in enumerate(expect or ()):
        out[f"{EXPECT}_{i}"] = status
    return out


def expecting(expect: Sequence[str] | None) -> int | None:
    """The ``expect`` of the statements below for a row that must be in one of ``expect`` (None: in any)."""
    return None if expect is None else len(expect)


def _where(table: sa.Table, expect: int | None) -> sa.ColumnElement[bool]:
    where: sa.ColumnElement[bool] = table.c.id == sa.bindparam(ID)
    if expect == 0:  # no status expected: no row
        where = sa.and_(where, sa.false())
    elif expect is not None:
        where = sa.and_(where, table.c.status.in_([sa.bindparam(f"{EXPECT}_{i}") for i in range(expect)]))
    return where


_UPDATES: dict[tuple[str, frozenset[str], int | None], sa.Update] = {}
_SELECTS: dict[tuple[str, tuple[str, ...], int | None, bool], sa.Select[Any]] = {}


def update_by_id(table: sa.Table, columns: frozenset[str], expect: int | None) -> sa.Update:
    """``UPDATE table SET <columns> WHERE id = :_id [AND status IN (:_expect_0, ...)]`` (``expect``: how many
    statuses the row may be in; None: any)."""
    key = (table.name, columns, expect)
    stmt = _UPDATES.get(key)
    if stmt is None:
        values = {table.c[c]: sa.bindparam(f"_v_{c}", type_=table.c[c].type) for c in sorted(columns)}
        stmt = _UPDATES[key] = sa.update(table).where(_where(table, expect)).values(values)
    return stmt


_RETURNING: dict[tuple[str, frozenset[str], tuple[str, ...]], sa.Update] = {}


def update_returning(table: sa.Table, columns: frozenset[str], returning: tuple[str, ...]) -> sa.Update:
    """``UPDATE table SET <columns> WHERE id = :_id AND status = :_expect_0 RETURNING <returning>``."""
    key = (table.name, columns, returning)
    stmt = _RETURNING.get(key)
    if stmt is None:
        stmt = _RETURNING[key] = update_by_id(table, columns, 1).returning(*(table.c[c] for c in returning))
    return stmt


def select_by_id(table: sa.Table, columns: tuple[str, ...], expect: int | None, lock: bool) -> sa.Select[Any]:
    """``SELECT <columns> FROM table WHERE id = :_id [AND status IN (:_expect_0, ...)] [FOR UPDATE]``."""
    key = (table.name, columns, expect, lock)
    stmt = _SELECTS.get(key)
    if stmt is None:
        q = sa.select(*(table.c[c] for c in columns)).where(_where(table, expect))
        stmt = _SELECTS[key] = q.with_for_update(of=table) if lock else q
    return stmt


#: Lists of ids up to this long are bound one parameter each, ``:_in_0``, ``:_in_1``, ... (a statement per length,
#: sent as compiled, on SQLite by its driver: ``store/direct.py``); a longer one is an expanding parameter.
LISTED = 16


def in_ids(column: sa.ColumnElement[Any], n: int) -> sa.ColumnElement[bool]:
    """``column IN (:_in_0, ..., :_in_<n-1>)`` (``n`` > 0)."""
    return column.in_([sa.bindparam(f"_in_{i}") for i in range(n)])


def ids_params(ids: Sequence[str]) -> dict[str, Any]:
    """The parameters of :func:`in_ids`."""
    return {f"_in_{i}": v for i, v in enumerate(ids)}
