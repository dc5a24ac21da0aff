"""The CLI refuses a name dstack's rules refuse before it calls the server (``apply -n``, ``project add``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cli_fakes import FakeClient, Result

CLI = Callable[..., Result]


def test_apply_name_follows_the_resource_rule(fake: FakeClient, cli: CLI) -> None:
    Path(".dstack.yml").write_text("type: task\ncommands: [x]\n")
    for bad in ("Bad", "a/b", "x" * 42, "../up", "a_b"):
        result = cli("apply", "-n", bad, "-y", "-d")
        assert result.code == 2, (bad, result)
        assert "Resource name should match regex '^[a-z][a-z0-9-]{1,40}$'" in result.err
        assert "--name" in result.err
    assert fake.calls == []


def test_project_add_name_follows_the_project_rule(env: Path, cli: CLI) -> None:
    result = cli("project", "add", "--name", "a b", "--url", "http://127.0.0.1:9", "--token", "t", "-y")
    assert result.code == 2
    assert "Project name should match regex '^[a-zA-Z0-9-_]{1,50}$'" in result.err
