"""Engines and transactions.

``Database.read()`` opens a plain (deferred) transaction; ``Database.write()`` opens a write
transaction that is serialised where the database needs it: ``BEGIN IMMEDIATE`` on SQLite (one writer
at a time, so a recount inside it sees every committed row) and ordinary transactions on Postgres,
where ``plan_apply`` takes row locks with ``SELECT ... FOR UPDATE``.

On SQLite the statements run on the event loop's thread (``store/sqlite_inline.py``), the writers of
the process queue on an asyncio lock before ``BEGIN IMMEDIATE``, and read connections are
``query_only``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeAlias

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from corral.store import deferred, sqlite_inline
from corral.store.errors import Conflict

#: The connection of an open transaction (``Database.read()``/``write()``), as code outside ``store`` names it
#: when it hands one on to the store's functions.
Connection: TypeAlias = AsyncConnection

#: The engines' execution option that tells the event recorder (``store/events.py``) how long events are kept.
EVENTS_TTL_OPTION = "corral_events_ttl"
#: How many connections of each SQLite engine stay open between transactions (``Database._connection``).
KEEP_IDLE = 4
#: Seconds a SQLite statement made on the loop's thread waits for a lock another process holds.
INLINE_BUSY_TIMEOUT = 5.0
#: Pages the WAL grows by before a commit checkpoints it into the database file (SQLite's default is 1,000:
#: https://www.sqlite.org/pragma.html#pragma_wal_autocheckpoint). A checkpoint copies each page written since
#: the last one once, however often it was rewritten, and syncs both files: the rows a job's life rewrites
#: (its job, its run, their indexes) are copied and synced four times less often at 4,000 (a WAL of up to
#: 16 MiB, reused, not regrown, after each checkpoint).
WAL_AUTOCHECKPOINT_PAGES = 4000


def _sqlite_engine(url: str, immediate: bool, options: dict[str, Any]) -> AsyncEngine:
    # Every use ends its transaction explicitly (``conn.begin()``), so the pool's rollback on return is
    # only a wasted round trip to the driver's thread.
    path = url.split("///", 1)[1] if "///" in url else ""
    extra: dict[str, Any] = {}
    if path and path != ":memory:" and not path.startswith("file:"):
        # statements made on the loop's thread (``store/sqlite_inline.py``); a lock wait holds the loop, so
        # it is short (writers of this process queue on ``Database.write``'s lock, not on SQLite's)
        extra["async_creator"] = sqlite_inline.creator(path, INLINE_BUSY_TIMEOUT)
    engine = create_async_engine(
        url,
        connect_args={"timeout": 30},
        **extra,
        pool_size=5 if immediate else 10,
        pool_reset_on_return=None,
        execution_options=options,
    )

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let us issue BEGIN ourselves (pysqlite's implicit transactions are not IMMEDIATE).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
        # a statement's temporary b-trees (a sort, a statement journal) in memory, not in files under /var/tmp
        # made and removed each time (https://www.sqlite.org/tempfiles.html)
        cur.execute("PRAGMA temp_store=MEMORY")
        cur.execute(f"PRAGMA busy_timeout={int((INLINE_BUSY_TIMEOUT if extra else 30.0) * 1000)}")
        cur.execute("PRAGMA foreign_keys=ON")
        if not immediate:
            # a read connection never writes: a write there would wait for SQLite's lock outside the
            # writers' queue (on the loop's thread, holding the loop); refused at once instead
            cur.execute("PRAGMA query_only=ON")
        cur.close()

    if extra:  # the commit and the rollback made in place (``store/sqlite_inline.py``)
        engine.sync_engine.dialect.do_commit = sqlite_inline.commit  # type: ignore[method-assign]
        engine.sync_engine.dialect.do_rollback = sqlite_inline.rollback  # type: ignore[method-assign]
    begin = "BEGIN IMMEDIATE" if immediate else "BEGIN"

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        # on the driver's cursor: a statement with no parameters and no result needs none of SQLAlchemy's
        # execution steps (about a third of an empty transaction's CPU); on a connection used on the loop's thread
        # (``store/sqlite_inline.py``), on SQLite's own connection, past the adapter's cursor and its greenlet
        driver = conn.connection.dbapi_connection.driver_connection
        if isinstance(driver, sqlite_inline.InlineConnection):
            driver.execute_now(begin)
            return
        cursor = conn.connection.dbapi_connection.cursor()
        try:
            cursor.execute(begin)
        finally:
            cursor.close()

    return engine


def private_sqlite_file(path: Path) -> None:
    """The database file readable by this OS user alone (0600), made so before SQLite opens it: SQLite
    gives its ``-wal`` and ``-shm`` files the database file's mode. A file made by an older corral with a
    looser mode (and its ``-wal``/``-shm``) is tightened."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            if p.stat().st_mode & 0o077:
                p.chmod(0o600)
        except FileNotFoundError:
            pass


class Database:
    """The connection pools of one server process. ``events_ttl``: how long events are kept (seconds; at most
    zero: none are stored)."""

    def __init__(self, url: str, events_ttl: float = 30 * 24 * 3600.0) -> None:
        self.url = url
        self.events_ttl = events_ttl
        options: dict[str, Any] = {EVENTS_TTL_OPTION: events_ttl}
        self.is_sqlite = url.startswith("sqlite")
        #: SQLite's statements made on the loop's thread (``_sqlite_engine``): a transaction's begin, commit and
        #: rollback need no greenlet (``_transaction``)
        self._inline = False
        if self.is_sqlite:
            path = url.split("///", 1)[1] if "///" in url else ""
            self._inline = bool(path and path != ":memory:" and not path.startswith("file:"))
            if self._inline:
                private_sqlite_file(Path(path))
            self._read = _sqlite_engine(url, immediate=False, options=options)
            self._write = _sqlite_engine(url, immediate=True, options=options)
        else:
            from corral.store.tables import add_postgres_options

            add_postgres_options()
            self._read = create_async_engine(
                url, pool_size=10, max_overflow=20, pool_pre_ping=True, execution_options=options
            )
            self._write = self._read
        self._write_lock = asyncio.Lock() if self.is_sqlite else None
        #: SQLite: engine -> its connections open between transactions (``_connection``).
        self._idle: dict[int, list[AsyncConnection]] = (
            {id(self._read): [], id(self._write): []} if self.is_sqlite else {}
        )

    @property
    def engine(self) -> AsyncEngine:
        return self._write

    @asynccontextmanager
    async def _connection(self, engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
        """A connection of ``engine``: on SQLite one kept open since an earlier transaction ended cleanly (its
        checkout and return are most of a short transaction's CPU), else a new checkout from the pool."""
        idle = self._idle.get(id(engine))
        if idle is None:  # Postgres: its pool's own checkout
            async with engine.connect() as conn:
                yield conn
            return
        conn = idle.pop() if idle else await engine.connect()
        kept = False
        try:
            yield conn
            kept = not conn.in_transaction() and not conn.invalidated and len(idle) < KEEP_IDLE
        finally:
            if kept:
                idle.append(conn)
            else:
                await conn.close()

    @asynccontextmanager
    async def _transaction(self, conn: AsyncConnection) -> AsyncIterator[None]:
        """A transaction on ``conn``, committed at the end, rolled back on an exception. Where SQLite's statements run
        on the loop's thread, its begin, commit and rollback are plain calls there (``store/sqlite_inline.py``):
        SQLAlchemy's own transaction, entered without the greenlet its asyncio wrapper would start for each (most of
        an empty transaction's CPU)."""
        if not self._inline:
            async with conn.begin():
                yield
            return
        assert conn.sync_connection is not None
        with conn.sync_connection.begin():
            yield

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        async with self._connection(self._read) as conn, self._transaction(conn):
            yield conn

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncConnection]:
        """A write transaction; the rows its statements add to events (``store/deferred.py``) are inserted
        together just before it commits. A unique key taken meanwhile, by a statement or at the commit, raises
        :class:`~corral.store.errors.Conflict` once the transaction has rolled back."""
        # the connection is taken before SQLite's lock and given back after it: the lock covers only the
        # transaction, since every round trip under it makes the other writers wait
        try:
            async with (
                self._connection(self._write) as conn,
                self._write_lock or contextlib.nullcontext(),
                self._transaction(conn),
            ):
                deferred.open_buffer(conn)
                try:
                    yield conn
                    await deferred.flush(conn)
                finally:
                    deferred.close_buffer(conn)
        except sa.exc.IntegrityError as e:
            raise Conflict(str(e.orig)) from e

    async def dispose(self) -> None:
        for idle in self._idle.values():
            while idle:
                await idle.pop().close()
        await self._read.dispose()
        if self._write is not self._read:
            await self._write.dispose()

    async def vacuum(self) -> None:
        """SQLite: rebuild the database file without its free pages (which may hold old values of rewritten rows)
        and empty the WAL. Outside any transaction."""
        async with self._write.connect() as conn:
            raw = await conn.get_raw_connection()
            driver: Any = raw.driver_connection
            await driver.execute("VACUUM")
            await driver.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    async def serialize(self, conn: AsyncConnection, key: int) -> None:
        """Hold a transaction-scoped lock on ``key`` (Postgres advisory lock; SQLite's write transaction
        is already exclusive), e.g. so that replicas starting together bootstrap once."""
        if not self.is_sqlite:
            await conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})

    def for_update(self, stmt: sa.Select[Any]) -> sa.Select[Any]:
        """Row locks on Postgres; on SQLite the IMMEDIATE transaction already excludes writers."""
        return stmt if self.is_sqlite else stmt.with_for_update()
