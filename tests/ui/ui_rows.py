"""Rows the UI tests show that no local server can make through the API: a volume (volumes live on the
``aws`` backend; these tests' servers have none), written with the store's own function into the test
server's database."""

from __future__ import annotations

import time

from corral.store import accounts, volumes
from server_harness import RunningServer


async def a_volume(server: RunningServer, project: str, name: str) -> str:
    """A ``submitted`` volume of ``project`` by the admin, 100GB in ``eu-west-1``; its id."""
    async with server.client() as c:
        me = (await c.post("/api/users/get_my_user", json={})).json()
    async with server.ctx.db.write() as conn:
        p = await accounts.get_project(conn, project)
        assert p is not None, project
        conf = {"type": "volume", "name": name, "backend": "aws", "region": "eu-west-1", "size": "100GB"}
        return await volumes.create(conn, p.id, me["id"], name, conf, time.time())
