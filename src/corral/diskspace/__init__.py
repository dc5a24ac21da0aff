"""Disk space of the server's state directory: how much is free, whether an error means "no space left", and
the message a refused write answers with.

Owns: the free-space measure (``statvfs``), the classification of a failed write as a full disk (the
operating system's ``ENOSPC``/``EDQUOT``, SQLite's ``SQLITE_FULL``, Postgres's ``53100 disk_full``), and the
watermark check (:func:`below_watermark`) that workers and services ask before writing what can wait, what is full
in words (the state directory, or the Postgres database: :func:`where_full`, :func:`refusal_for`), and -- in
:mod:`corral.diskspace.episode` -- the background work's writes that fail for lack of space: said once, tried again.

May import: the standard library only (no other corral package, no database driver), so that every layer may use it.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

#: SQLite's primary result code for "database or disk is full" (https://www.sqlite.org/rescode.html#full).
SQLITE_FULL = 13
#: Postgres's SQLSTATE ``disk_full`` (https://www.postgresql.org/docs/current/errcodes-appendix.html).
PG_DISK_FULL = "53100"
#: The operating system's "no space left on device" and "disk quota exceeded" (errno(3)).
_OS_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
_SQLITE_FULL_TEXT = "database or disk is full"


@dataclass(frozen=True)
class Space:
    """The free space of the file system holding ``path``, in bytes (what an unprivileged writer may use)."""

    path: Path
    free: int
    total: int


def space(path: Path) -> Space:
    """The free and total space of the file system holding ``path`` (its nearest existing parent)."""
    probe = path
    while True:  # one system call where the path exists (every apply asks, for the state directory)
        try:
            st = os.statvfs(probe)
        except OSError as e:  # the errors ``Path.exists`` reads as "not there": its nearest existing parent
            if e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP) or probe == probe.parent:
                raise
            probe = probe.parent
        else:
            return Space(path, st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)


def below_watermark(path: Path, watermark: int) -> Space | None:
    """The space of ``path`` when less than ``watermark`` bytes are free there, else None."""
    s = space(path)
    return s if s.free < watermark else None


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the errors it wraps: its cause, its context, a database driver's original error."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    out: list[BaseException] = []
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        out.append(e)
        todo.extend(x for x in (e.__cause__, e.__context__, getattr(e, "orig", None)) if isinstance(x, BaseException))
    return out


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it wraps: its cause, context, or a database driver's original error)
    says that a write failed for lack of space."""
    return any(_says_full(e) for e in _chain(exc))


def _says_full(e: BaseException) -> bool:
    if isinstance(e, OSError) and e.errno in _OS_FULL:
        return True
    if getattr(e, "sqlite_errorcode", None) == SQLITE_FULL or _SQLITE_FULL_TEXT in str(e):
        return True
    return _postgres_full(e)


def _postgres_full(e: BaseException) -> bool:
    return PG_DISK_FULL in (getattr(e, "sqlstate", None), getattr(e, "pgcode", None))


def mib(n: int) -> str:
    """``n`` bytes in MiB, for messages."""
    return f"{n / 2**20:.1f} MiB"


def refusal(state_dir: Path, watermark: int | None = None) -> str:
    """Why a write was refused: the state directory, its free space and (when it was the watermark's doing)
    the watermark, and what to do."""
    s = space(state_dir)
    why = (
        f"less than the {mib(watermark)} kept free (CORRAL_MIN_FREE_DISK_MB)"
        if watermark is not None
        else "the write failed for lack of space"
    )
    return (
        f"No space left for the server's state: {mib(s.free)} free of {mib(s.total)} in {state_dir}, {why}. "
        "Free space there (or grow the disk) and try again; reads keep working, and writes resume by themselves."
    )


def database_label(url: str) -> str | None:
    """The database a Postgres URL names, for messages (``corral on db.internal:5432``; never its password);
    None for SQLite, whose file is in the state directory."""
    if url.startswith("sqlite"):
        return None
    parts = urlsplit(url)
    name = parts.path.lstrip("/") or "(the default database)"
    try:
        port = parts.port
    except ValueError:
        port = None
    where = f"{parts.hostname}:{port}" if port else (parts.hostname or "the local socket")
    return f"{name} on {where}"


def database_full(exc: BaseException) -> bool:
    """Whether ``exc`` is Postgres's ``53100 disk_full``: the database's disk is the full one, not the state
    directory's (freeing room there does not help)."""
    return any(_postgres_full(e) for e in _chain(exc))


def _postgres_said(exc: BaseException) -> str | None:
    """Postgres's primary message of a ``53100`` in ``exc``'s chain, on one line: the driver's own error's
    ``message`` (asyncpg's; not its wrapper's text, which adds the class and a hint on lines of their own)."""
    full = [e for e in _chain(exc) if _postgres_full(e)]
    primary = [m for m in (getattr(e, "message", None) for e in full) if isinstance(m, str) and m]
    said = primary[0] if primary else next((str(e) for e in full if str(e)), None)
    return " ".join(said.split()) if said else None


def where_full(state_dir: Path, exc: BaseException, database: str | None = None) -> str:
    """What is full, in one line: the state directory and its free space, or -- when Postgres refused the write
    with its ``53100 disk_full`` -- the database (``database``: :func:`database_label`) and Postgres's words (its
    disk is not the state directory's then, and only Postgres's host can measure it)."""
    said = _postgres_said(exc)
    if said is None:
        s = space(state_dir)
        return f"no space left in the state directory {state_dir}: {mib(s.free)} free of {mib(s.total)}"
    name = f" {database}" if database else ""
    return f"no space left in the database{name}: Postgres answered {PG_DISK_FULL} disk_full ({said})"


def refusal_for(state_dir: Path, exc: BaseException, database: str | None = None) -> str:
    """Why a write that failed with ``exc`` (a full disk) was refused: Postgres's own words, naming the database
    (``database``: :func:`database_label`), when the database's disk is the full one (it is not the state
    directory's with Postgres), else :func:`refusal`."""
    said = _postgres_said(exc)
    if said is None:
        return refusal(state_dir)
    name = f" {database}" if database else ""
    return (
        f"No space left in the database{name}: Postgres answered {PG_DISK_FULL} disk_full ({said}). Free space on "
        "the database's disk (or grow it) and try again; reads keep working, and writes resume by themselves."
    )


#: The emergency reserve: a file kept in the state directory while there is room, deleted when the server
#: starts on a full disk so that the database can be opened (SQLite must create its ``-wal`` and ``-shm``
#: files). CockroachDB keeps such a file for the same reason (its "emergency ballast",
#: https://www.cockroachlabs.com/docs/stable/cluster-setup-troubleshooting#disks-filling-up).
RESERVE_NAME = "disk-reserve"


def release_reserve(state_dir: Path) -> int:
    """Delete the reserve now (a stop or a delete that could not be written on a full disk gets its room): the
    bytes it gave back (0: there was none). It is made again at the next start with room."""
    path = state_dir / RESERVE_NAME
    try:
        size = path.stat().st_size
        path.unlink()
    except FileNotFoundError:
        return 0
    return size


def settle_reserve(state_dir: Path, size: int, watermark: int) -> str | None:
    """At start: delete the reserve when the disk has less than ``size`` free, too little to open the database
    (what was done, to log), or make it (``size`` bytes) when there is room for it and the watermark."""
    path = state_dir / RESERVE_NAME
    s = space(state_dir)
    if path.exists() and s.free < max(size, 2**20):
        size = path.stat().st_size
        path.unlink()
        return (
            f"the state directory {state_dir} is full ({mib(s.free)} free): its {mib(size)} reserve "
            f"({path}) was deleted so that the server could start; new runs and jobs' output are refused until "
            "space returns"
        )
    if size and not path.exists() and s.free >= size + watermark:
        tmp = path.with_name(RESERVE_NAME + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)  # blocks taken for real, not a sparse file
            finally:
                os.close(fd)
            tmp.rename(path)
        except OSError:
            tmp.unlink(missing_ok=True)
    return None
