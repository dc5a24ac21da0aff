"""SQLite on the event loop's thread: aiosqlite's connection with every call made in place.

aiosqlite runs each call in a thread of its own per connection and hands the result back to the loop:
two thread switches per statement, and under load each waits for the GIL (up to the interpreter's switch
interval) while the loop runs Python code. corral's statements are short and bounded (indexed, never a
scan that grows with history), and on SQLite one process is the only writer (``Database.write`` takes an
asyncio lock before ``BEGIN IMMEDIATE``, and WAL readers never wait for it), so a statement made in place
costs less than the hand-off; the loop is held only while SQLite works.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Generator
from typing import Any

import aiosqlite


class _InPlace:
    """What aiosqlite's work queue is given (SQLAlchemy's adapter also puts work on it), done at once."""

    def put_nowait(self, item: tuple[Any, Callable[[], Any]]) -> None:
        future, fn = item
        try:
            result = fn()
        except BaseException as e:  # handed to the awaiting side, as aiosqlite's thread does
            if future is not None:
                future.set_exception(e)
            return
        if future is not None:
            future.set_result(result)


class InlineConnection(aiosqlite.Connection):
    def __init__(self, connector: Callable[[], sqlite3.Connection], iter_chunk_size: int = 64) -> None:
        super().__init__(connector, iter_chunk_size)  # its thread object is never started
        self._tx = _InPlace()  # type: ignore[assignment]

    async def _execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not self._running or not self._connection:
            raise ValueError("Connection closed")
        return fn(*args, **kwargs)

    async def _connect(self) -> InlineConnection:
        if self._connection is None:
            self._connection = self._connector()
        return self

    def __await__(self) -> Generator[Any, None, InlineConnection]:
        return self._connect().__await__()

    def execute_now(self, sql: str) -> None:
        """``sql`` (no parameters, no result: ``BEGIN``) run on SQLite's connection at once, on this thread."""
        self._open().execute(sql)

    def commit_now(self) -> None:
        """Commit on SQLite's connection at once, on this thread (not through an awaitable, which SQLAlchemy's
        adapter would wait for with a greenlet switch to the loop and back)."""
        self._open().commit()

    def rollback_now(self) -> None:
        """Roll back on SQLite's connection at once, on this thread."""
        self._open().rollback()

    def _open(self) -> sqlite3.Connection:
        if not self._running or self._connection is None:
            raise ValueError("Connection closed")
        return self._connection

    def stop(self) -> None:
        self._running = False
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    async def close(self) -> None:
        self.stop()


def commit(dbapi_connection: Any) -> None:
    """A SQLite dialect's ``do_commit``: on a connection whose statements run on the loop's thread, SQLite's commit made
    in place; on any other, the adapter's."""
    driver = dbapi_connection.driver_connection
    if isinstance(driver, InlineConnection):
        driver.commit_now()
    else:
        dbapi_connection.commit()


def rollback(dbapi_connection: Any) -> None:
    """A SQLite dialect's ``do_rollback``: :func:`commit`'s counterpart."""
    driver = dbapi_connection.driver_connection
    if isinstance(driver, InlineConnection):
        driver.rollback_now()
    else:
        dbapi_connection.rollback()


def creator(path: str, timeout: float) -> Callable[[], Any]:
    """``create_async_engine``'s ``async_creator`` for the database file at ``path``."""

    async def connect() -> InlineConnection:
        return await InlineConnection(lambda: sqlite3.connect(path, timeout=timeout, check_same_thread=False))

    return connect
