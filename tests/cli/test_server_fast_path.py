"""``corral server``'s fast path (corral.cli.server_fast_path) parses exactly as the Typer command does, and
skips Typer."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from corral.cli.main import app
from corral.cli.server_fast_path import DEFAULTS, OPTIONS, plain_server_options

CASES: list[tuple[list[str], dict[str, str]]] = [
    ([], {}),
    (["--port", "3100"], {}),
    (["-p", "3100", "--host", "0.0.0.0"], {}),
    (["--port=3100", "--host=::1", "--log-level=debug"], {}),
    (["-p3100", "-lwarning"], {}),
    (["-p", "1", "-p", "2"], {}),
    ([], {"CORRAL_SERVER_PORT": "4000", "CORRAL_SERVER_HOST": "0.0.0.0", "CORRAL_SERVER_LOG_LEVEL": "debug"}),
    (["--port", "4100"], {"CORRAL_SERVER_PORT": "4000"}),
    (["--port", "4100"], {"CORRAL_SERVER_PORT": "not-a-port"}),
    ([], {"CORRAL_SERVER_PORT": ""}),
    (["--host="], {}),
    (["--access-log", "-p", "3100"], {}),
    ([], {"CORRAL_SERVER_ACCESS_LOG": "true"}),
    ([], {"CORRAL_SERVER_ACCESS_LOG": "0"}),
    (["--access-log"], {"CORRAL_SERVER_ACCESS_LOG": "no"}),
]
FALLBACK: list[list[str]] = [
    ["--help"],
    ["-h"],
    ["--port"],
    ["--port", "x"],
    ["-p=3000"],
    ["--verbose"],
    ["extra"],
    ["--", "--port", "1"],
    ["--access-log=1"],
]


def _server_command() -> typer.core.TyperCommand:
    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="corral")
    command = root.get_command(ctx, "server")  # type: ignore[attr-defined]
    assert command is not None
    return command  # type: ignore[no-any-return]


@pytest.mark.parametrize(("args", "env"), CASES)
def test_fast_path_parses_as_typer_does(args: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for _, var in OPTIONS.values():
        monkeypatch.delenv(var, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    fast = plain_server_options(["server", *args], os.environ)
    assert fast is not None
    assert fast == _server_command().make_context("server", list(args)).params


@pytest.mark.parametrize("args", FALLBACK)
def test_anything_else_goes_to_typer(args: list[str]) -> None:
    assert plain_server_options(["server", *args], {}) is None
    assert plain_server_options(["ps", *args], {}) is None


def test_fast_path_knows_every_option_of_the_server_command() -> None:
    """A new option of `corral server` must be taught to corral.cli.server_fast_path too (or it would be ignored
    there)."""
    params = {p.name: p for p in _server_command().params if p.name != "help"}
    assert set(params) == set(OPTIONS)
    for name, (names, var) in OPTIONS.items():
        assert set(params[name].opts) == set(names)
        assert params[name].envvar == var  # type: ignore[attr-defined]
        assert params[name].default == DEFAULTS[name]


@pytest.mark.parametrize(
    "command",
    [
        ["-m", "corral.cli.main", "server", "--port", "1"],
        ["-c", "import sys; sys.argv = ['corral', 'server', '-p', '1']; from corral.cli.entry import main; main()"],
    ],
)
def test_plain_server_start_does_not_import_typer(command: list[str], tmp_path: Path) -> None:
    with open(tmp_path / "server.lock", "a+") as lock:  # held: the server stops right after its first imports
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        env = {**os.environ, "CORRAL_SERVER_DIR": str(tmp_path)}
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", *command], env=env, capture_output=True, text=True, timeout=60
        )
    assert proc.returncode == 1
    assert "Another corral server" in proc.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert not {m for m in imported if m.split(".")[0] in ("typer", "rich")}  # (uvicorn imports click itself)
