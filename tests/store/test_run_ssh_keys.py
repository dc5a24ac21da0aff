"""A user's key rotation as the runs see it (``store.run_ssh_keys``): the user's reachable runs that carry
the old key get the new one; finished ones past the grace period, other users' runs and runs with a key of
their own are left alone."""

from __future__ import annotations

import orjson
import sqlalchemy as sa

from corral.store import run_ssh_keys
from corral.store.db import Database
from corral.store.migrate import upgrade
from corral.store.tables import projects, runs, users

OLD = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOldOldOld%_ old@corral"
NEW = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINewNewNew new@corral"
OWN = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIClientOwnKey laptop"


async def test_replace_run_keys(db_url: str) -> None:
    db = Database(db_url)
    await upgrade(db)
    async with db.write() as conn:
        for uid in ("u1", "u2"):
            await conn.execute(
                sa.insert(users).values(
                    id=uid, name=uid, token="t", token_hash=uid, global_role="user", active=True, deleted=False,
                    created_at=0.0,
                )
            )  # fmt: skip
        await conn.execute(sa.insert(projects).values(id="p", name="p", owner_id="u1", created_at=0.0, backends="[]"))
        cases = {
            "running": ("u1", "running", 100.0, OLD),
            "recent": ("u1", "done", 950.0, OLD),  # finished within the grace period
            "old": ("u1", "done", 100.0, OLD),  # finished long ago: nobody reaches it
            "theirs": ("u2", "running", 100.0, OLD),  # another user's run
            "own": ("u1", "running", 100.0, OWN),  # a key of the run's own
        }
        for name, (uid, status, processed, key) in cases.items():
            await conn.execute(
                sa.insert(runs).values(
                    id=name, project_id="p", user_id=uid, run_name=name, submitted_at=0.0, last_processed_at=processed,
                    status=status, run_spec=orjson.dumps({"ssh_key_pub": key, "x": 1}).decode(), priority=0,
                    deployment_num=0, deleted=False,
                )
            )  # fmt: skip
        assert await run_ssh_keys.replace_run_keys(conn, "u1", OLD, NEW, since=900.0) == 2
    async with db.read() as conn:
        rows = (await conn.execute(sa.select(runs.c.id, runs.c.run_spec))).all()
    got = {r.id: orjson.loads(r.run_spec) for r in rows}
    assert {name: spec["ssh_key_pub"] for name, spec in got.items()} == {
        "running": NEW, "recent": NEW, "old": OLD, "theirs": OLD, "own": OWN,
    }  # fmt: skip
    assert all(spec["x"] == 1 for spec in got.values())
    await db.dispose()
