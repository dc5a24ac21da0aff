"""The server's optional config.yml: projects it lists exist after start; bad files fail clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.config.server_config import ServerConfigError, load_server_config
from server_harness import make_settings, running_server


async def test_projects_from_config_yml(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    settings.server_dir.mkdir(parents=True)
    (settings.server_dir / "config.yml").write_text(
        "projects:\n  - name: main\n  - name: team-a\n    backends: [{type: local}]\n"
    )
    async with running_server(settings) as s, s.client() as c:
        names = {p["project_name"] for p in (await c.post("/api/projects/list", json={})).json()}
        assert names == {"main", "team-a"}


def test_bad_config_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "config.yml"
    path.write_text("projects:\n  - name: main\n    backends: [{type: aws}]\n")
    with pytest.raises(ServerConfigError, match=r"projects\.0\.backends\.0\.type"):
        load_server_config(path)
    path.write_text("projects: [\n")
    with pytest.raises(ServerConfigError, match="not valid YAML"):
        load_server_config(path)
