"""The sealing passes' statements: only rows that may hold a secret in clear are read, and a row is rewritten
only while it still holds what was read (a write made meanwhile wins)."""

from __future__ import annotations

import time

import sqlalchemy as sa

from corral.store import secrets_in_clear as in_clear
from corral.store.db import Database
from corral.store.migrate import upgrade
from corral.store.tables import projects, users
from store_rows import admin_and_project

_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----\n"


async def test_rows_in_clear_are_read_and_rewritten_only_while_unchanged(db_url: str) -> None:
    db = Database(db_url)
    await upgrade(db)
    async with db.write() as conn:
        await admin_and_project(conn, time.time())  # user "u" with token "t", in clear
        await conn.execute(sa.update(projects).where(projects.c.id == "p").values(ssh_private_key=_KEY))
    async with db.read() as conn:
        found_users = await in_clear.users_with_secrets_in_clear(conn)
        found_keys = await in_clear.project_keys_in_clear(conn)
    assert found_users == [in_clear.UserSecrets("u", "t", None)]
    assert found_keys == [in_clear.StoredText("p", _KEY)]
    async with db.write() as conn:  # the project's key changes meanwhile: that write wins
        await conn.execute(sa.update(projects).where(projects.c.id == "p").values(ssh_private_key=_KEY + "x"))
        assert await in_clear.rewrite_project_keys(conn, [in_clear.Rewrite("p", _KEY, "enc:v1:key")]) == 0
        assert await in_clear.rewrite_user_secrets(conn, found_users[0], "enc:v1:token", None) == 1
    async with db.read() as conn:
        assert (await conn.execute(sa.select(projects.c.ssh_private_key))).scalar_one() == _KEY + "x"
        assert (await conn.execute(sa.select(users.c.token))).scalar_one() == "enc:v1:token"
        assert await in_clear.users_with_secrets_in_clear(conn) == []
    await db.dispose()
