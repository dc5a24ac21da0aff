"""Fixtures for the host-agent tests (see ``agent_harness``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_harness import AgentProc, cleanup, start_agent


@pytest.fixture
def agent_factory(tmp_path: Path) -> Iterator[Any]:
    started: list[AgentProc] = []

    def factory(name: str = "agent", **kwargs: Any) -> AgentProc:
        a = start_agent(tmp_path / name, **kwargs)
        started.append(a)
        return a

    yield factory
    for a in started:
        cleanup(a)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProc]:
    a = start_agent(tmp_path_factory.mktemp("shared-agent") / "work", env={"AGENT_ONLY_SECRET": "leak"})
    yield a
    cleanup(a)
