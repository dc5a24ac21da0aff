"""Store tests run on SQLite and on a throwaway Postgres."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        from pg_harness import new_database_url

        return new_database_url()
    return f"sqlite+aiosqlite:///{tmp_path / 'c.db'}"
