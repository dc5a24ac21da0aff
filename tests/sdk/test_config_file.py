"""Round trips of ~/.corral/config.yml through corral.sdk.config_file."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml

from corral.sdk import config_file
from corral.sdk.errors import ConfigFileError


@pytest.fixture(autouse=True)
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CORRAL_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.delenv("CORRAL_PROJECT", raising=False)
    return tmp_path / "cfg"


def test_missing_file_is_empty_and_get_project_explains(config_dir: Path) -> None:
    assert config_file.load() == {"projects": []}
    with pytest.raises(ConfigFileError) as info:
        config_file.get_project()
    assert str(info.value) == (
        "No project configured. Start a server with `corral server` or run "
        "`corral project add --name main --url URL --token TOKEN`"
    )


def test_add_project_writes_dstack_shape_with_mode_0600(config_dir: Path) -> None:
    path = config_file.add_project("main", "http://127.0.0.1:3000/", "t1")
    assert path == config_dir / "config.yml"
    assert yaml.safe_load(path.read_text()) == {
        "projects": [{"name": "main", "url": "http://127.0.0.1:3000", "token": "t1", "default": True}]
    }
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert config_file.get_project()["token"] == "t1"


def test_default_switches_and_replacing_keeps_one_entry() -> None:
    config_file.add_project("main", "http://a", "t1")
    config_file.add_project("other", "http://b", "t2", default=False)
    assert config_file.get_project()["name"] == "main"
    config_file.add_project("other", "http://b2", "t3")
    projects = config_file.list_projects()
    assert [(p["name"], p["default"]) for p in projects] == [("main", False), ("other", True)]
    assert config_file.get_project("other")["url"] == "http://b2"
    config_file.set_default("main")
    assert config_file.get_project()["name"] == "main"
    assert config_file.get_project("other")["token"] == "t3"


def test_first_project_is_default_even_if_not_asked() -> None:
    config_file.add_project("solo", "http://a", "t", default=False)
    assert config_file.get_project()["name"] == "solo"


def test_unknown_project_errors() -> None:
    config_file.add_project("main", "http://a", "t")
    with pytest.raises(ConfigFileError, match="Project nope is not configured"):
        config_file.get_project("nope")
    with pytest.raises(ConfigFileError, match="Project nope is not configured"):
        config_file.set_default("nope")


def test_env_project_override(monkeypatch: pytest.MonkeyPatch) -> None:
    config_file.add_project("main", "http://a", "t1")
    config_file.add_project("dev", "http://b", "t2", default=False)
    monkeypatch.setenv("CORRAL_PROJECT", "dev")
    assert config_file.get_project()["name"] == "dev"


def test_config_dir_is_read_at_call_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config_file.add_project("main", "http://a", "t1")
    monkeypatch.setenv("CORRAL_CONFIG_DIR", str(tmp_path / "elsewhere"))
    assert config_file.list_projects() == []


def test_delete_project_moves_default() -> None:
    config_file.add_project("a", "http://a", "t1")
    config_file.add_project("b", "http://b", "t2", default=False)
    config_file.delete_project("a")
    assert config_file.get_project()["name"] == "b"
    with pytest.raises(ConfigFileError):
        config_file.delete_project("a")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("projects: [\n", "not valid YAML"),
        ("- a\n", "must be a mapping"),
        ("projects:\n  - {name: x}\n", r"projects\[0\] lacks url, token"),
    ],
)
def test_invalid_file(config_dir: Path, text: str, match: str) -> None:
    config_dir.mkdir(parents=True)
    (config_dir / "config.yml").write_text(text)
    with pytest.raises(ConfigFileError, match=match):
        config_file.load()
