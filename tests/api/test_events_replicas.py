"""Two server replicas on one Postgres each record the events of the changes they make, once: a user made
through each, a fleet applied through one whose instance the replicas' workers create and provision."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

from pg_harness import new_database_url
from server_harness import fleet_body, make_settings, running_server, wait_for


async def test_two_replicas_record_their_own_changes_once(tmp_path: Path) -> None:
    url, key = new_database_url(), base64.b64encode(os.urandom(32)).decode()
    first = make_settings(tmp_path / "a", database_url=url, encryption_key=key)
    second = make_settings(tmp_path / "b", database_url=url, encryption_key=key)
    async with running_server(first) as a, running_server(second) as b, a.client() as on_a, b.client() as on_b:
        assert (await on_a.post("/api/users/create", json={"username": "via-a", "global_role": "user"})).is_success
        assert (await on_b.post("/api/users/create", json={"username": "via-b", "global_role": "user"})).is_success
        applied = await on_b.post("/api/project/main/fleets/apply", json=fleet_body(name="rf", nodes=1))
        assert applied.status_code == 200, applied.text
        fleet_id = applied.json()["id"]

        async def provisioned() -> list[dict[str, Any]] | None:
            r = await on_a.post("/api/events/list", json={"within_fleets": [fleet_id], "ascending": True})
            found: list[dict[str, Any]] = r.json()
            return found if any(e["message"] == "Instance status changed PENDING -> IDLE" for e in found) else None

        in_fleet = await wait_for(provisioned, timeout=60)
        for c in (on_a, on_b):
            every = (await c.post("/api/events/list", json={"ascending": True})).json()
            ids = [e["id"] for e in every]
            assert len(ids) == len(set(ids))
            users = [(e["message"], e["targets"][0]["name"]) for e in every if e["targets"][0]["type"] == "user"]
            # the first replica's bootstrap made admin; the second found it made
            assert users == [("User created", "admin"), ("User created", "via-a"), ("User created", "via-b")], users
            assert [e["message"] for e in every if e["targets"][0]["type"] == "project"] == ["Project created"]
        assert [e["message"] for e in in_fleet] == [
            "Fleet created. Status: ACTIVE",
            "Instance created to meet target fleet node count. Status: PENDING",
            "Instance status changed PENDING -> IDLE",
        ]
