"""Plans made at the same time share one ``SnapshotBuilder``: each load's facts (who imports a fleet, the projects'
backends and regions) are its own value, so a plan whose load is followed by another project's load (while it
waits on EC2 for capacity reservations) still builds its fleets from what it read."""

from __future__ import annotations

from pathlib import Path

from corral.scheduler.types import FleetSlot
from corral.store.fleet_reader import FleetReader
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


async def test_a_pass_remakes_a_fleets_slot_only_when_its_record_or_facts_changed(tmp_path: Path) -> None:
    """The scheduling worker's passes: a fleet read again unchanged keeps its slot (the same object), fleets
    configured alike but for their names share one match of the backends' offers, and an export made since (a fact
    about the fleet) or a changed configuration gives the fleet a new slot."""
    async with running_server(make_settings(tmp_path, background_processing=False)) as s, s.client() as admin:
        assert (await admin.post("/api/projects/create", json={"project_name": "team-b"})).status_code == 200
        for body in (fleet_body(name="fa"), fleet_body(name="fb"), fleet_body(name="fc", nodes="0..1")):
            r = await admin.post("/api/project/main/fleets/apply", json=body)
            assert r.status_code == 200, r.text
        builder, reader = SnapshotBuilder(s.ctx.computes), FleetReader()

        async def slots() -> dict[str, FleetSlot]:
            async with s.ctx.db.read() as conn:
                fleets = await reader.read(conn)
                await builder.refresh(conn)
            return {f.name: builder.fleet_slot(f) for f in fleets}

        first = await slots()
        again = await slots()
        assert all(again[name] is slot for name, slot in first.items())
        assert first["fa"].offers and first["fa"].offers is first["fb"].offers
        share = {"name": "share", "importer_projects": ["team-b"], "exported_fleets": ["fa"]}
        assert (await admin.post("/api/project/main/exports/create", json=share)).status_code == 200
        body = fleet_body(name="fc", nodes="0..1", resources={"cpu": "1..", "memory": "0.2GB..", "disk": "1GB.."})
        assert (await admin.post("/api/project/main/fleets/apply", json={**body, "force": True})).status_code == 200
        later = await slots()
        assert later["fa"] is not first["fa"] and later["fa"].importer_project_ids
        assert later["fb"] is first["fb"]
        assert later["fc"] is not first["fc"]
