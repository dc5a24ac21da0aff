"""A unique key taken by another writer reaches the store's callers as ``store.errors.Conflict``: raised by the
insert that clashes, inside the transaction, or by ``Database.write`` once the transaction has rolled back."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from corral.store import fleets
from corral.store.db import Database
from corral.store.errors import Conflict
from corral.store.migrate import upgrade
from corral.store.tables import runs
from store_rows import a_run, admin_and_project


def _fleet(fleet_id: str, now: float) -> dict[str, object]:
    return {
        "id": fleet_id,
        "project_id": "p",
        "name": "f",
        "created_at": now,
        "last_processed_at": now,
        "status": "active",
        "status_message": None,
        "spec": "{}",
    }


async def test_a_taken_name_is_a_conflict_in_the_transaction_and_out_of_it(db_url: str) -> None:
    db = Database(db_url)
    await upgrade(db)
    now = time.time()
    async with db.write() as conn:
        await admin_and_project(conn, now)
        await a_run(conn, "r1", now, name="same")
        await fleets.insert_fleet(conn, _fleet("f1", now))
    # the store function says so itself, so its caller can answer inside the transaction
    with pytest.raises(Conflict):
        async with db.write() as conn:
            await fleets.insert_fleet(conn, _fleet("f2", now))
    # a clash of a statement made elsewhere in the store: the transaction rolls back, then Conflict
    with pytest.raises(Conflict) as raised:
        async with db.write() as conn:
            await conn.execute(sa.update(runs).where(runs.c.id == "r1").values(last_processed_at=now + 1))
            await a_run(conn, "r2", now, name="same")
    assert isinstance(raised.value.__cause__, sa.exc.IntegrityError)
    async with db.read() as conn:
        rows = (await conn.execute(sa.select(runs.c.id, runs.c.last_processed_at))).all()
        assert [tuple(r) for r in rows] == [("r1", now)]
    await db.dispose()
