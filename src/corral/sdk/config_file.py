"""The CLI's configuration file, ``~/.corral/config.yml`` (like dstack's ``~/.dstack/config.yml``).

Shape::

    projects:
      - {name: main, url: http://127.0.0.1:3000, token: <token>, default: true}

The directory is ``$CORRAL_CONFIG_DIR`` when set, else ``~/.corral``; it is read at every call,
never at import, so tests can point it at a temporary directory. The file holds tokens, so it is
written with mode 0600. ``corral server`` calls :func:`add_project` on its first start to record
its admin's ``main`` project, as ``dstack server`` does.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, TypedDict

from corral.sdk.errors import ConfigFileError

CONFIG_DIR_ENV = "CORRAL_CONFIG_DIR"
PROJECT_ENV = "CORRAL_PROJECT"


class ProjectEntry(TypedDict):
    """One configured project: where its server is and the token to use there."""

    name: str
    url: str
    token: str
    default: bool


class ConfigData(TypedDict):
    """The whole file."""

    projects: list[ProjectEntry]


def config_dir() -> Path:
    """The configuration directory (``$CORRAL_CONFIG_DIR`` or ``~/.corral``)."""
    override = os.environ.get(CONFIG_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return Path.home() / ".corral"


def config_path() -> Path:
    """The configuration file's path."""
    return config_dir() / "config.yml"


def load() -> ConfigData:
    """Read the file; a missing file is an empty configuration."""
    import yaml

    path = config_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {"projects": []}
    except OSError as e:
        raise ConfigFileError(f"Cannot read {path}: {e.strerror or e}") from e
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigFileError(f"{path} is not valid YAML: {_first_line(str(e))}") from e
    return {"projects": _parse_projects(raw, path)}


def save(data: ConfigData) -> Path:
    """Write the file atomically with mode 0600; returns its path."""
    import yaml

    path = config_path()
    projects = [
        {"name": p["name"], "url": p["url"], "token": p["token"], "default": bool(p["default"])}
        for p in data["projects"]
    ]
    text = yaml.safe_dump({"projects": projects}, sort_keys=False)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".config.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        raise ConfigFileError(f"Cannot write {path}: {e.strerror or e}") from e
    return path


def add_project(name: str, url: str, token: str, default: bool = True) -> Path:
    """Add or replace the project ``name``; make it the default if asked or if it is the only one."""
    if not name:
        raise ConfigFileError("A project needs a name")
    data = load()
    projects = [p for p in data["projects"] if p["name"] != name]
    if default or not any(p["default"] for p in projects):
        for p in projects:
            p["default"] = False
        default = True
    projects.append({"name": name, "url": url.rstrip("/"), "token": token, "default": default})
    return save({"projects": projects})


def delete_project(name: str) -> Path:
    """Remove the project ``name`` from the file."""
    data = load()
    projects = [p for p in data["projects"] if p["name"] != name]
    if len(projects) == len(data["projects"]):
        raise ConfigFileError(f"Project {name} is not configured in {config_path()}")
    if projects and not any(p["default"] for p in projects):
        projects[0]["default"] = True
    return save({"projects": projects})


def set_default(name: str) -> Path:
    """Make ``name`` the default project."""
    data = load()
    if not any(p["name"] == name for p in data["projects"]):
        raise ConfigFileError(
            f"Project {name} is not configured; add it with `corral project add --name {name} --url URL --token TOKEN`"
        )
    for p in data["projects"]:
        p["default"] = p["name"] == name
    return save(data)


def list_projects() -> list[ProjectEntry]:
    """All configured projects, in file order."""
    return load()["projects"]


def get_project(name: str | None = None) -> ProjectEntry:
    """The project ``name``; without a name ``$CORRAL_PROJECT``, else the default one."""
    projects = load()["projects"]
    name = name or os.environ.get(PROJECT_ENV) or None
    if name is not None:
        for p in projects:
            if p["name"] == name:
                return p
        raise ConfigFileError(
            f"Project {name} is not configured; add it with `corral project add --name {name} --url URL --token TOKEN`"
        )
    for p in projects:
        if p["default"]:
            return p
    if len(projects) == 1:
        return projects[0]
    raise ConfigFileError(
        "No project configured. Start a server with `corral server` or run "
        "`corral project add --name main --url URL --token TOKEN`"
        if not projects
        else "No default project; choose one with `corral project set-default NAME`"
    )


def _parse_projects(raw: Any, path: Path) -> list[ProjectEntry]:
    if raw is None:
        return []
    if not isinstance(raw, dict):
        raise ConfigFileError(f"{path} must be a mapping with a `projects` list")
    items = raw.get("projects") or []
    if not isinstance(items, list):
        raise ConfigFileError(f"{path}: `projects` must be a list")
    projects: list[ProjectEntry] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ConfigFileError(f"{path}: projects[{i}] must be a mapping")
        missing = [k for k in ("name", "url", "token") if not item.get(k)]
        if missing:
            raise ConfigFileError(f"{path}: projects[{i}] lacks {', '.join(missing)}")
        projects.append(
            {
                "name": str(item["name"]),
                "url": str(item["url"]),
                "token": str(item["token"]),
                "default": bool(item.get("default", False)),
            }
        )
    return projects


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text
