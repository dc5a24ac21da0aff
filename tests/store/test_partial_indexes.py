"""The unique indexes over live (not soft-deleted) rows: the metadata states their predicate for the
dialect in use (Postgres's is attached when a Postgres database is opened) and it is the one the
migrations built."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.schema import CreateIndex

from corral.store import tables
from corral.store.db import Database
from corral.store.migrate import upgrade


async def test_live_unique_indexes_have_the_predicate_the_migrations_built(db_url: str) -> None:
    db = Database(db_url)
    await upgrade(db)
    expected = "deleted = 0" if db.is_sqlite else "deleted = false"
    assert len(tables._LIVE_UNIQUE) == 4  # projects, fleets, runs, volumes
    async with db.read() as conn:
        for index in tables._LIVE_UNIQUE:
            ddl = str(CreateIndex(index).compile(dialect=conn.dialect))
            assert ddl.endswith(f"WHERE {expected}"), ddl
            if db.is_sqlite:
                query = sa.text("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = :n")
            else:
                query = sa.text("SELECT indexdef FROM pg_indexes WHERE indexname = :n")
            built = (await conn.execute(query, {"n": index.name})).scalar_one()
            assert expected in built, built
    await db.dispose()


def test_adding_the_postgres_options_is_idempotent() -> None:
    tables.add_postgres_options()
    tables.add_postgres_options()
    for index in tables._LIVE_UNIQUE:
        assert str(index.dialect_kwargs["postgresql_where"]) == "deleted = false"
        assert str(index.dialect_kwargs["sqlite_where"]) == "deleted = 0"
