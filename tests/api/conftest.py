"""A fresh corral server per test, on SQLite and on Postgres (workers on, local backend)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from server_harness import RunningServer, make_settings, running_server


@pytest.fixture(params=["sqlite", "postgres"])
async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[RunningServer]:
    settings = make_settings(tmp_path)
    if request.param == "postgres":
        from pg_harness import new_database_url

        settings = replace(settings, database_url=new_database_url())
    async with running_server(settings) as s:
        yield s
