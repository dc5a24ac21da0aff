from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.store.db import Database
from corral.store.migrate import upgrade
from server_harness import RunningServer, make_settings, running_server


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[RunningServer]:
    async with running_server(make_settings(tmp_path)) as s:
        yield s


#: A migrated database, on SQLite and on Postgres (the worker tests that drive the store directly).
@pytest.fixture(params=["sqlite", "postgres"])
async def db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    if request.param == "postgres":
        from pg_harness import new_database_url

        url = new_database_url()
    else:
        url = f"sqlite+aiosqlite:///{tmp_path / 'c.db'}"
    database = Database(url)
    await upgrade(database)
    try:
        yield database
    finally:
        await database.dispose()
