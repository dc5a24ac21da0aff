"""Plans made at the same time share one ``SnapshotBuilder``: each load's facts (who imports a fleet, the projects'
backends and regions) are its own value, so a plan whose load is followed by another project's load (while it
waits on EC2 for capacity reservations) still builds its fleets from what it read."""

from __future__ import annotations

from pathlib import Path

from corral.workers.snapshot_builder import SnapshotBuilder
from server_harness import fleet_body, make_settings, running_server


async def test_a_loads_facts_stay_its_own_when_another_plan_loads_meanwhile(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path, background_processing=False)) as s, s.client() as admin:
        for p in ("team-b", "team-c"):
            assert (await admin.post("/api/projects/create", json={"project_name": p})).status_code == 200
        assert (await admin.post("/api/project/main/fleets/apply", json=fleet_body(name="fl"))).status_code == 200
        share = {"name": "share", "importer_projects": ["team-b"], "exported_fleets": ["fl"]}
        assert (await admin.post("/api/project/main/exports/create", json=share)).status_code == 200
        ids = {p["project_name"]: p["project_id"] for p in (await admin.post("/api/projects/list", json={})).json()}

        builder = SnapshotBuilder(s.ctx.computes)
        async with s.ctx.db.read() as conn:
            fleets_b, facts_b = await builder.load_for(conn, [ids["main"]], importer=ids["team-b"])  # team-b's plan
            _, facts_c = await builder.load_for(conn, [ids["main"]], importer=ids["team-c"])  # then team-c's
        (fleet,) = fleets_b
        assert builder.fleet_slot(fleet, facts_b).importer_project_ids == frozenset({ids["team-b"]})
        assert builder.fleet_slot(fleet, facts_c).importer_project_ids == frozenset()
        assert builder.fleet_slot(fleet, facts_b).offers  # main's local backend: offers from main's backends
