"""Which server replicas may have requests in flight to a service replica (``store.service_drains``): a
hold is written only while the replica is in rotation, counted per replica, released per server, and
the rows of ended replicas are pruned -- on SQLite and Postgres."""

from __future__ import annotations

import sqlalchemy as sa
from test_plan_apply import _db, _job

from corral.store import service_drains
from corral.store.tables import jobs


async def test_holds_follow_rotation_and_are_released_per_server(db_url: str) -> None:
    db = await _db(db_url)
    for job_id in ("a", "b"):
        await _job(db, job_id)
    async with db.write() as conn:
        assert await service_drains.hold(conn, "a", "s1", 1.0)
        assert await service_drains.hold(conn, "a", "s1", 2.0)  # again: still in rotation, one row
        assert await service_drains.hold(conn, "a", "s2", 2.0)
        assert await service_drains.hold(conn, "b", "s1", 2.0)
        assert not await service_drains.hold(conn, "nosuch", "s1", 2.0)
    async with db.read() as conn:
        assert await service_drains.holders(conn, ["a", "b", "c"]) == {"a": 2, "b": 1}
    async with db.write() as conn:
        await conn.execute(sa.update(jobs).where(jobs.c.id == "b").values(drain_at=3.0))
        # left rotation: a server that did not hold it yet is refused, one that holds it learns so
        assert not await service_drains.hold(conn, "b", "s2", 3.0)
        assert not await service_drains.hold(conn, "b", "s1", 3.0)
        await service_drains.release(conn, ["a"], "s1")
    async with db.read() as conn:
        assert await service_drains.holders(conn, ["a", "b"]) == {"a": 1, "b": 1}
    async with db.write() as conn:
        await conn.execute(sa.update(jobs).where(jobs.c.id == "b").values(status="terminated"))
        await service_drains.prune(conn)  # "b" ended holding a row (its server died): dropped
        await service_drains.forget(conn, ["a"])
    async with db.read() as conn:
        assert await service_drains.holders(conn, ["a", "b"]) == {}
    await db.dispose()
