"""Online backup and restore of the embedded database (SQLite), and what a backup holds.

- :func:`backup_sqlite` copies a live database with SQLite's online backup API
  (https://www.sqlite.org/backup.html; Python's ``sqlite3.Connection.backup``): a consistent snapshot
  taken page by page while the server keeps writing (WAL readers and writers are not blocked).
- :func:`inspect` reads a backup without the server's key: its schema revision, and the ids of the keys
  its sealed values were encrypted with (``enc:v1:<key id>:...``, :mod:`corral.store.encryption`), found
  in every text column of every table, so that a restore can say which key it needs.
- :func:`sealed_values` yields every sealed value a backup holds, for the restore to open each one with
  the key it was given before the backup is put in place.
- :func:`restore_sqlite` puts a backup in place of a database that does not exist yet (never over one).

Imports: the standard library and :mod:`corral.store.encryption` (the sealed values' shape).
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from corral.store.encryption import SEALED_PREFIX

#: A sealed value inside a column (alone, or inside a JSON document): ``enc:v1:<key id>:<base64>``.
_SEALED = re.compile(re.escape(SEALED_PREFIX) + r"([0-9a-f]{8}):([A-Za-z0-9+/]+={0,2})")
#: Pages copied per step of the online backup: small steps let the server's writers in between.
_PAGES_PER_STEP = 1024


class BackupError(Exception):
    """A backup cannot be read or written; the message says why and what to do."""


@dataclass(frozen=True)
class BackupInfo:
    """What a backup holds, read without the key."""

    revision: str | None
    key_ids: frozenset[str]
    sealed: int
    size: int


def sqlite_path(database_url: str) -> Path | None:
    """The file of a ``sqlite`` database URL (None: not SQLite, or in memory)."""
    scheme, sep, rest = database_url.partition(":///")
    if not (sep and scheme.startswith("sqlite")) or not rest or rest.startswith(":memory:"):
        return None
    return Path(rest.split("?", 1)[0])


def backup_sqlite(source: Path, dest: Path, progress: Callable[[int, int], None] | None = None) -> None:
    """A consistent copy of the live database ``source`` in ``dest`` (made 0600; written beside it and
    renamed into place, so that ``dest`` is never half-written)."""
    if not source.exists():
        raise BackupError(f"There is no database at {source}")
    partial = dest.with_name(dest.name + ".partial")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    try:
        # the source is only read; a read-only open of a database in WAL mode may fail, so it is not asked for
        with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(partial)) as out:
            src.backup(out, pages=_PAGES_PER_STEP, progress=_step(progress))
            out.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, no -wal beside it
        os.replace(partial, dest)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _step(progress: Callable[[int, int], None] | None) -> Callable[[int, int, int], object] | None:
    if progress is None:
        return None
    return lambda _status, remaining, total: progress(total - remaining, total)


def _open_read_only(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise BackupError(f"{path} is not a file")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError:
        conn.close()
        raise BackupError(f"{path} is not a corral backup (not an SQLite database)") from None
    return conn


def _revision(conn: sqlite3.Connection, path: Path) -> str | None:
    try:
        rows = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    except sqlite3.DatabaseError:
        raise BackupError(f"{path} is not a corral backup (it has no schema version)") from None
    return rows[0][0] if rows else None


def _text_columns(conn: sqlite3.Connection) -> Iterator[tuple[str, str]]:
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for table in tables:
        for _cid, column, kind, *_ in conn.execute(f'PRAGMA table_info("{table}")'):
            if not kind or any(t in kind.upper() for t in ("CHAR", "TEXT", "CLOB", "JSON")):
                yield table, column


def _sealed_in(conn: sqlite3.Connection) -> Iterator[tuple[str, str, str]]:
    """(table.column, key id, whole sealed value) for every sealed value of the database."""
    for table, column in _text_columns(conn):
        query = f'SELECT "{column}" FROM "{table}" WHERE instr("{column}", ?) > 0'
        for (value,) in conn.execute(query, (SEALED_PREFIX,)):
            for m in _SEALED.finditer(str(value)):
                yield f"{table}.{column}", m.group(1), m.group(0)


def inspect(path: Path) -> BackupInfo:
    """A backup's schema revision and the ids of the keys its sealed values need (no key needed)."""
    with closing(_open_read_only(path)) as conn:
        revision = _revision(conn, path)
        key_ids = set()
        count = 0
        for _where, key_id, _value in _sealed_in(conn):
            key_ids.add(key_id)
            count += 1
    return BackupInfo(revision=revision, key_ids=frozenset(key_ids), sealed=count, size=path.stat().st_size)


def sealed_values(path: Path) -> Iterator[tuple[str, str]]:
    """(table.column, sealed value) for every sealed value of the backup at ``path``."""
    with closing(_open_read_only(path)) as conn:
        for where, _key_id, value in _sealed_in(conn):
            yield where, value


def restore_sqlite(backup: Path, dest: Path) -> None:
    """The backup copied to ``dest``, which must not exist (nor its ``-wal``): written beside it, renamed."""
    for p in (dest, dest.with_name(dest.name + "-wal")):
        if p.exists():
            raise BackupError(
                f"A database already exists at {p}: restore onto a fresh state directory (or move it away first)"
            )
    dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    backup_sqlite(backup, dest)
