"""Fixtures for in-process CLI tests: a temporary config dir and a fake API client."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from cli_fakes import FakeClient, Result

from corral.cli import render
from corral.cli.main import run
from corral.sdk import config_file


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CORRAL_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.delenv("CORRAL_PROJECT", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def fake(env: Path, monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    client = FakeClient()
    config_file.add_project("main", "http://127.0.0.1:3000", "tok")
    monkeypatch.setattr("corral.cli.common.client_for", lambda project: (client, project or "main"))
    monkeypatch.setattr("corral.cli.apply_run.time.sleep", lambda s: None)
    return client


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    def invoke(*argv: str) -> Result:
        render.reset_console()
        code = run(list(argv))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return invoke
