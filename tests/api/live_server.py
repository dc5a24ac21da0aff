"""A real ``corral server`` process for synchronous clients (schemathesis, Hypothesis), seeded with data
of every kind the API serves: a project with a fleet and its instance, a finished run with logs, a
second project the fleet is exported to, a repo, a public key and a second user. The ids a test needs
to reach past "not found" are in ``Seeded``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

TOKEN = "fuzz-admin-token-0123456789"
RESOURCES = {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."}
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHqXF2nAXjD6cKuF0Wv7SNe/R3mdbD3SW0wpD8nx0d0p fuzz@corral"


@dataclass
class Seeded:
    url: str
    token: str
    project: str = "main"
    other_project: str = "other"
    fleet: str = "fuzz-fleet"
    run: str = "fuzz-run"
    export: str = "fuzz-export"
    repo: str = "fuzz-repo"
    user: str = "fuzz-user"
    ids: dict[str, Any] = field(default_factory=dict)

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=30)


def _ok(r: httpx.Response) -> Any:
    assert r.status_code == 200, f"{r.request.method} {r.request.url}: {r.status_code} {r.text}"
    return r.json()


def seed(s: Seeded) -> None:
    """Everything the API lists, made through the API (a minute at most: the run is one short command)."""
    p = f"/api/project/{s.project}"
    with s.client() as c:
        _ok(c.post("/api/projects/create", json={"project_name": s.other_project}))
        _ok(c.post("/api/users/create", json={"username": s.user, "global_role": "user"}))
        conf = {"type": "fleet", "name": s.fleet, "nodes": "1", "resources": RESOURCES}
        body = {"force": True, "plan": {"spec": {"configuration": conf, "profile": {}}}}
        fleet = _ok(c.post(p + "/fleets/apply", json=body))
        s.ids["fleet_id"] = fleet["id"]
        task = {
            "type": "task",
            "name": s.run,
            "commands": ["echo fuzz-out"],
            "fleets": [s.fleet],
            "resources": RESOURCES,
        }
        _ok(c.post(p + "/runs/apply", json={"force": True, "plan": {"run_spec": {"configuration": task}}}))
        deadline = time.monotonic() + 90
        while True:
            run = _ok(c.post(p + "/runs/get", json={"run_name": s.run}))
            if run["status"] in ("done", "failed", "terminated"):
                break
            assert time.monotonic() < deadline, f"the seed run did not finish: {run['status']} {run['status_message']}"
            time.sleep(0.2)
        assert run["status"] == "done", run
        s.ids["job_submission_id"] = run["latest_job_submission"]["id"]
        instances = _ok(c.post("/api/instances/list", json={"project_names": [s.project]}))
        s.ids["instance_id"] = instances[0]["id"]
        s.ids["instance_num"] = instances[0]["instance_num"]
        body = {"name": s.export, "importer_projects": [s.other_project], "exported_fleets": [s.fleet]}
        _ok(c.post(p + "/exports/create", json=body))
        repo = {"repo_id": s.repo, "repo_info": {"repo_type": "virtual"}}
        _ok(c.post(p + "/repos/init", json=repo))
        key = _ok(c.post("/api/users/public_keys/add", json={"key": PUBLIC_KEY, "name": "fuzz"}))
        s.ids["public_key_id"] = key["id"]


@contextlib.contextmanager
def live_server(tmp: Path) -> Iterator[Seeded]:
    """``corral server`` as a process of its own (the e2e harness): a synchronous client in the test's
    process then has a core to itself, as the server has."""
    from dstack_client_env import corral_server

    with corral_server(tmp, TOKEN, CORRAL_SANDBOX="off") as server:
        yield Seeded(url=server.url, token=TOKEN)
