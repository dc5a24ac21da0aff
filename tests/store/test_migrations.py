"""Migrations: the schema they build is exactly the tables' metadata, and the fast head check agrees
with Alembic."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from corral.store.db import Database
from corral.store.migrate import _current, alembic_config, head_revisions, upgrade
from corral.store.tables import metadata


def test_fast_head_check_matches_alembic() -> None:
    assert head_revisions() == set(ScriptDirectory.from_config(alembic_config()).get_heads())


async def test_upgrade_builds_the_metadata_and_is_idempotent(db_url: str) -> None:
    db = Database(db_url)
    await upgrade(db)
    await upgrade(db)
    assert await _current(db) == head_revisions()

    def diff(conn: sa.Connection) -> list[object]:
        return list(compare_metadata(MigrationContext.configure(conn), metadata))

    async with db.engine.connect() as conn:
        assert await conn.run_sync(diff) == []
    await db.dispose()
