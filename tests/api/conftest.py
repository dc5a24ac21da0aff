"""A fresh corral server per test (SQLite in a temp dir, workers on, local backend)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from server_harness import RunningServer, make_settings, running_server


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[RunningServer]:
    async with running_server(make_settings(tmp_path)) as s:
        yield s
