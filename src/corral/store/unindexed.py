"""A column written so that no index is read for its term: ``+column`` on SQLite, the column elsewhere.

SQLite's planner has no statistics (corral runs no ``ANALYZE``), so for ``id IN (...) AND status IN (...)`` it
guesses: past a few ids it reads the status's index, every row of that status, and keeps the few asked for. A
unary ``+`` is SQLite's documented way to take a term out of the index choice (sqlite.org/optoverview.html,
"Disqualifying WHERE Clause Terms Using Unary-'+'"); Postgres chooses by its statistics and reads the column.

Imports sqlalchemy only.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement


class unindexed(FunctionElement[Any]):
    """``column`` as a term no index is chosen for."""

    inherit_cache = True
    name = "unindexed"

    def __init__(self, column: sa.ColumnElement[Any]) -> None:
        super().__init__(column)
        self.type = column.type


@compiles(unindexed)
def _plain(element: unindexed, compiler: SQLCompiler, **kw: Any) -> str:
    return str(compiler.process(element.clauses, **kw))


@compiles(unindexed, "sqlite")
def _sqlite(element: unindexed, compiler: SQLCompiler, **kw: Any) -> str:
    return "+" + str(compiler.process(element.clauses, **kw))
