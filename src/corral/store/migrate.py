"""Schema migrations at start-up (Alembic), run on the server's own engine.

On Postgres the upgrade holds an advisory lock so that several replicas starting at once migrate
exactly once; on SQLite the state-directory lock already guarantees a single server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import text

from corral.store.db import Database

_MIGRATIONS = Path(__file__).parent / "migrations"
_ADVISORY_KEY = 0x636F7272616C  # "corral"


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    return cfg


def _upgrade(sync_conn: Any) -> None:
    cfg = alembic_config()
    cfg.attributes["connection"] = sync_conn
    command.upgrade(cfg, "head")


async def upgrade(db: Database) -> None:
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
