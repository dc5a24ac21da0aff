"""Repos, each user's repo credentials, uploaded code and file archives (the blobs runs need).

Blobs live in the database so that any server replica can hand them to an agent. Code is
content-addressed per project (``codes``: one row per (project, sha256)); file archives per user
(``file_archives``: one row per (user, sha256), with the id that run specs reference). Inserting a
blob that is already there is a no-op, so an identical upload is never stored twice.
Credentials are stored as given (the service encrypts them before they get here).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store.tables import codes, file_archives, repo_creds, repos, runs


@dataclass(frozen=True)
class ArchiveRec:
    id: str
    user_id: str
    blob_hash: str
    size: int


def _insert(conn: AsyncConnection, table: sa.Table) -> Any:
    """An INSERT with ON CONFLICT, in the connection's dialect (imported here: a SQLite server never loads
    SQLAlchemy's Postgres dialect)."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects import postgresql

        return postgresql.insert(table)
    from sqlalchemy.dialects import sqlite

    return sqlite.insert(table)


async def _upsert(conn: AsyncConnection, table: sa.Table, values: dict[str, Any], keys: Sequence[str]) -> None:
    stmt = _insert(conn, table).values(**values)
    changes = {k: v for k, v in values.items() if k not in keys}
    await conn.execute(stmt.on_conflict_do_update(index_elements=list(keys), set_=changes))


# ---- repos -------------------------------------------------------------------------------------


async def get_repo(conn: AsyncConnection, project_id: str, repo_id: str) -> dict[str, Any] | None:
    """The repo's ``repo_info`` or None."""
    row = (
        await conn.execute(sa.select(repos.c.info).where(repos.c.project_id == project_id, repos.c.repo_id == repo_id))
    ).first()
    return dict(json.loads(row.info)) if row is not None else None


async def list_repos(conn: AsyncConnection, project_id: str) -> list[tuple[str, dict[str, Any]]]:
    rows = await conn.execute(
        sa.select(repos.c.repo_id, repos.c.info).where(repos.c.project_id == project_id).order_by(repos.c.repo_id)
    )
    return [(r.repo_id, dict(json.loads(r.info))) for r in rows]


async def save_repo(conn: AsyncConnection, project_id: str, repo_id: str, info: dict[str, Any]) -> None:
    values = {"project_id": project_id, "repo_id": repo_id, "info": json.dumps(info)}
    await _upsert(conn, repos, values, ("project_id", "repo_id"))


async def delete_repos(conn: AsyncConnection, project_id: str, repo_ids: Sequence[str]) -> None:
    """The repos and everyone's credentials for them (uploaded code stays: queued runs may need it)."""
    await conn.execute(
        sa.delete(repo_creds).where(repo_creds.c.project_id == project_id, repo_creds.c.repo_id.in_(repo_ids))
    )
    await conn.execute(sa.delete(repos).where(repos.c.project_id == project_id, repos.c.repo_id.in_(repo_ids)))


# ---- credentials ---------------------------------------------------------------------------------


def _creds_key(project_id: str, repo_id: str, user_id: str) -> Any:
    return sa.and_(
        repo_creds.c.project_id == project_id, repo_creds.c.repo_id == repo_id, repo_creds.c.user_id == user_id
    )


async def get_creds(conn: AsyncConnection, project_id: str, repo_id: str, user_id: str) -> str | None:
    """The user's stored (encrypted) credentials for the repo."""
    row = (await conn.execute(sa.select(repo_creds.c.creds).where(_creds_key(project_id, repo_id, user_id)))).first()
    return str(row.creds) if row is not None else None


async def save_creds(conn: AsyncConnection, project_id: str, repo_id: str, user_id: str, creds: str) -> None:
    values = {"project_id": project_id, "repo_id": repo_id, "user_id": user_id, "creds": creds}
    await _upsert(conn, repo_creds, values, ("project_id", "repo_id", "user_id"))


async def delete_creds(conn: AsyncConnection, project_id: str, repo_id: str, user_id: str) -> None:
    await conn.execute(sa.delete(repo_creds).where(_creds_key(project_id, repo_id, user_id)))


# ---- code ------------------------------------------------------------------------------------------


async def has_code(conn: AsyncConnection, project_id: str, blob_hash: str) -> bool:
    q = sa.select(codes.c.size).where(codes.c.project_id == project_id, codes.c.blob_hash == blob_hash)
    return (await conn.execute(q)).first() is not None


async def add_code(conn: AsyncConnection, project_id: str, blob_hash: str, blob: bytes, now: float) -> bool:
    """Store the code unless the project has it already; True if a row was written."""
    stmt = _insert(conn, codes).values(
        project_id=project_id, blob_hash=blob_hash, size=len(blob), blob=blob, created_at=now
    )
    result = await conn.execute(stmt.on_conflict_do_nothing(index_elements=["project_id", "blob_hash"]))
    return bool(result.rowcount)


async def get_code(conn: AsyncConnection, project_id: str, blob_hash: str) -> bytes | None:
    q = sa.select(codes.c.blob).where(codes.c.project_id == project_id, codes.c.blob_hash == blob_hash)
    row = (await conn.execute(q)).first()
    return bytes(row.blob) if row is not None else None


# ---- file archives -----------------------------------------------------------------------------------

_ARCHIVE_COLS = (file_archives.c.id, file_archives.c.user_id, file_archives.c.blob_hash, file_archives.c.size)


def _archive(row: Any) -> ArchiveRec:
    return ArchiveRec(id=row.id, user_id=row.user_id, blob_hash=row.blob_hash, size=row.size)


async def archive_by_hash(conn: AsyncConnection, user_id: str, blob_hash: str) -> ArchiveRec | None:
    q = sa.select(*_ARCHIVE_COLS).where(file_archives.c.user_id == user_id, file_archives.c.blob_hash == blob_hash)
    row = (await conn.execute(q)).first()
    return _archive(row) if row is not None else None


async def archives_by_ids(conn: AsyncConnection, ids: Sequence[str]) -> dict[str, ArchiveRec]:
    if not ids:
        return {}
    rows = await conn.execute(sa.select(*_ARCHIVE_COLS).where(file_archives.c.id.in_(list(ids))))
    return {r.id: _archive(r) for r in rows}


async def add_archive(
    conn: AsyncConnection, archive_id: str, user_id: str, blob_hash: str, blob: bytes, now: float
) -> ArchiveRec:
    """Store the archive unless the user has one with this hash; returns the stored one either way."""
    stmt = _insert(conn, file_archives).values(
        id=archive_id, user_id=user_id, blob_hash=blob_hash, size=len(blob), blob=blob, created_at=now
    )
    await conn.execute(stmt.on_conflict_do_nothing(index_elements=["user_id", "blob_hash"]))
    found = await archive_by_hash(conn, user_id, blob_hash)
    assert found is not None
    return found


async def get_archive_blob(conn: AsyncConnection, archive_id: str) -> bytes | None:
    row = (await conn.execute(sa.select(file_archives.c.blob).where(file_archives.c.id == archive_id))).first()
    return bytes(row.blob) if row is not None else None


# ---- runs ---------------------------------------------------------------------------------------------


_RUN_USER = sa.select(runs.c.user_id).where(runs.c.id == sa.bindparam("_id"))  # built once (store/prebuilt.py)


async def run_user_id(conn: AsyncConnection, run_id: str) -> str | None:
    """Who submitted the run (whose repo credentials and file archives its jobs use)."""
    row = (await conn.execute(_RUN_USER, {"_id": run_id})).first()
    return str(row.user_id) if row is not None else None
