"""The server's optional config.yml: projects it lists exist after start; bad files fail clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.config.server_config import ServerConfigError, load_server_config
from server_harness import make_settings, running_server, wait_for


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
    path.write_text("projects:\n  - name: main\n    backends: [{type: gcp}]\n")
    with pytest.raises(ServerConfigError, match=r"projects\.0\.backends\.0: .*gcp"):
        load_server_config(path)
    path.write_text("projects: [\n")
    with pytest.raises(ServerConfigError, match="not valid YAML"):
        load_server_config(path)


async def _offers(c: object, project: str) -> int:
    from server_harness import fleet_body

    spec = fleet_body(name="fl")["plan"]["spec"]
    r = await c.post(f"/api/project/{project}/fleets/get_plan", json={"spec": spec})  # type: ignore[attr-defined]
    assert r.status_code == 200, r.text
    return int(r.json()["total_offers"])


async def test_the_local_backend_belongs_to_the_projects_config_yml_names(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    settings.server_dir.mkdir(parents=True)
    (settings.server_dir / "config.yml").write_text(
        "projects:\n  - name: team-a\n    backends: [{type: local}]\n  - name: team-b\n    backends: []\n"
    )
    async with running_server(settings) as s, s.client() as c:
        await c.post("/api/projects/create", json={"project_name": "made-by-api"})
        offers = {p: await _offers(c, p) for p in ("main", "team-a", "team-b", "made-by-api")}
        assert offers == {"main": 1, "team-a": 1, "team-b": 0, "made-by-api": 0}
        backends = {
            p: (await c.post(f"/api/projects/{p}/get")).json()["backends"] for p in ("main", "team-a", "made-by-api")
        }
        assert backends["main"] == backends["team-a"] == [{"name": "remote", "config": {"type": "remote"}}]
        assert backends["made-by-api"] == []
        # a fleet of a project without a backend gets no instance, even with nodes.min set
        from server_harness import fleet_body

        assert (
            await c.post("/api/project/team-b/fleets/apply", json=fleet_body(name="fl", nodes="1"))
        ).status_code == 200
        assert (
            await c.post("/api/project/team-a/fleets/apply", json=fleet_body(name="fl", nodes="1"))
        ).status_code == 200

        async def team_a_instance() -> bool:
            found = (await c.post("/api/instances/list", json={})).json()
            return any(i["project_name"] == "team-a" for i in found)

        await wait_for(team_a_instance)
        found = (await c.post("/api/instances/list", json={})).json()
        assert {i["project_name"] for i in found} == {"team-a"}
        task = {"run_spec": {"configuration": {"type": "task", "commands": ["true"]}}}
        gpus = (await c.post("/api/project/team-b/gpus/list", json=task)).json()
        assert gpus == {"gpus": []}
        for p in ("team-a", "team-b"):
            await c.post(f"/api/project/{p}/fleets/delete", json={"names": ["fl"]})
