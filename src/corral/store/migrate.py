"""Schema migrations at start-up (Alembic), run on the server's own engine.

On Postgres the upgrade holds an advisory lock so that several replicas starting at once migrate
exactly once; on SQLite the state-directory lock already guarantees a single server.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from corral.store.db import Database

if TYPE_CHECKING:
    from alembic.config import Config

_MIGRATIONS = Path(__file__).parent / "migrations"
_ADVISORY_KEY = 0x636F7272616C  # "corral"


def head_revisions() -> set[str]:
    """The head revision ids, read from the migration files (no Alembic import on the hot path)."""
    revs = known_revisions()
    parents = {d for d in revs.values() if d}
    return {r for r in revs if r not in parents}


def known_revisions() -> dict[str, str | None]:
    """Every revision id this corral's migration files know, with the one it follows."""
    revs: dict[str, str | None] = {}
    for path in (_MIGRATIONS / "versions").glob("*.py"):
        src = path.read_text()
        rev = re.search(r"^revision\s*=\s*['\"]([^'\"]+)['\"]", src, re.M)
        down = re.search(r"^down_revision\s*=\s*(?:['\"]([^'\"]+)['\"]|None)", src, re.M)
        if rev:
            revs[rev.group(1)] = down.group(1) if down else None
    return revs


async def _current(db: Database) -> set[str]:
    try:
        async with db.read() as conn:
            return {row[0] for row in await conn.execute(text("SELECT version_num FROM alembic_version"))}
    except DBAPIError:
        return set()


def alembic_config() -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    return cfg


def _upgrade(sync_conn: Any) -> None:
    from alembic import command

    cfg = alembic_config()
    cfg.attributes["connection"] = sync_conn
    command.upgrade(cfg, "head")


async def upgrade(db: Database) -> None:
    """Bring the schema to head; a database already at head costs one query (Alembic stays unimported)."""
    if await _current(db) == head_revisions():
        return
    async with db.engine.connect() as conn:
        if not db.is_sqlite:
            await conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _ADVISORY_KEY})
        try:
            await conn.run_sync(_upgrade)
            await conn.commit()
        finally:
            if not db.is_sqlite:
                await conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _ADVISORY_KEY})
                await conn.commit()
