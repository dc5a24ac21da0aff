"""The partial indexes (unique over live, not soft-deleted, rows; the queue's own index): the metadata
states their predicate for the dialect in use (Postgres's is attached when a Postgres database is opened)
and it is the one the migrations built."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.schema import CreateIndex

from corral.store import queue_reader, tables
from corral.store.db import Database
from corral.store.migrate import upgrade


async def test_live_unique_indexes_have_the_predicate_the_migrations_built(db_url: str) -> None:
    db = Database(db_url)
    await upgrade(db)
    live = "deleted = 0" if db.is_sqlite else "deleted = false"
    # projects, fleets, runs, volumes; a project's one default gateway; the queue
    assert [i.name for i, _ in tables._POSTGRES_WHERE][-1] == "ix_jobs_queued"
    assert len(tables._POSTGRES_WHERE) == 6
    async with db.read() as conn:
        for index, where in tables._POSTGRES_WHERE:
            expected = live if where == "deleted = false" else where
            if index.name == "ux_gateways_project_default":
                expected = "is_default = 1" if db.is_sqlite else "is_default = true"
            ddl = str(CreateIndex(index).compile(dialect=conn.dialect))
            assert ddl.endswith(f"WHERE {expected}"), ddl
            if db.is_sqlite:
                query = sa.text("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = :n")
            else:
                query = sa.text("SELECT indexdef FROM pg_indexes WHERE indexname = :n")
            built = (await conn.execute(query, {"n": index.name})).scalar_one()
            if where == "deleted = false":
                assert expected in built, built
            elif index.name == "ux_gateways_project_default":  # Postgres writes it: WHERE (is_default = true)
                assert "is_default" in built and ("= 1" in built or "true" in built), built
            else:  # Postgres writes the predicate its own way: ((status)::text = 'submitted'::text) AND ...
                assert "'submitted'" in built and "instance_id IS NULL" in built, built
    await db.dispose()


async def test_the_queue_is_read_from_its_own_index_alone(db_url: str) -> None:
    """A scheduling pass reads the queue's state from ``ix_jobs_queued`` without the table's rows; on SQLite
    it names the index (its planner would take ``ix_jobs_instance_status`` and read every row)."""
    db = Database(db_url)
    await upgrade(db)
    async with db.read() as conn:
        if db.is_sqlite:
            query = queue_reader._QUEUE_STATE["sqlite"]
            plan = [row[-1] for row in (await conn.execute(sa.text(f"EXPLAIN QUERY PLAN {query}"))).all()]
            assert plan == ["SCAN jobs USING INDEX ix_jobs_queued"], plan
        else:  # Postgres picks by cost: on an empty table, with the cheaper ways off, that it can
            await conn.execute(sa.text("SET LOCAL enable_seqscan = off"))
            await conn.execute(sa.text("SET LOCAL enable_bitmapscan = off"))
            query = queue_reader._QUEUE_STATE["postgresql"]
            plan = [row[0] for row in (await conn.execute(sa.text(f"EXPLAIN {query}"))).all()]
            assert plan[0].startswith("Index Only Scan using ix_jobs_queued"), plan
    await db.dispose()
