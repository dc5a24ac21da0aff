"""Stored run specs read back typed (``config.run_spec.read``): a run stored by ``runs/apply`` gives the
configuration and profile it was submitted with, and the job specs derived from what was read are the ones
stored with its jobs; documents of the shapes older versions stored (no profile, no normalised fields, a
service's legacy ``replicas`` list) still read."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from corral.config import run_spec
from corral.services.job_specs import derive
from corral.store import run_secrets
from corral.store import runs as run_store
from server_harness import RunningServer, make_settings, running_server

RESOURCES = {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningServer]:
    tmp: Path = tmp_path_factory.mktemp("stored-specs")
    async with running_server(make_settings(tmp, background_processing=False)) as s:
        yield s


async def _stored(server: RunningServer, run_spec: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Apply ``run_spec``; the run spec and the job specs as stored (registry passwords revealed)."""
    async with server.client() as c:
        r = await c.post("/api/project/main/runs/apply", json={"force": False, "plan": {"run_spec": run_spec}})
        assert r.status_code == 200, r.text
        run_id = r.json()["id"]
    async with server.ctx.db.read() as conn:
        rec = await run_store.get_run_by_id(conn, run_id)
    assert rec is not None
    rec = run_secrets.revealed(server.ctx.cipher, rec)
    jobs = sorted(rec.jobs, key=lambda j: (j.replica_num, j.job_num))
    return dict(rec.run_spec), [dict(j.job_spec) for j in jobs]


@pytest.mark.asyncio(loop_scope="module")
async def test_a_stored_task_reads_back_typed_and_derives_its_stored_job_specs(server: RunningServer) -> None:
    conf = {
        "type": "task",
        "name": "stored-task",
        "commands": ["echo hi"],
        "env": {"A": "1"},
        "image": "ubuntu",
        "registry_auth": {"username": "u", "password": "p-SECRET"},
        "priority": 7,
        "retry": {"on_events": ["no-capacity"], "duration": "2h"},
        "resources": RESOURCES,
    }
    stored, jobs = await _stored(server, {"configuration": conf, "profile": {"max_price": 1.5}})
    spec = run_spec.read(stored)
    assert spec.conf.type == "task" and spec.run_name == "stored-task" and spec.priority == 7
    assert spec.conf.env == {"A": "1"} and spec.merged.max_price == 1.5
    assert spec.configuration == stored["configuration"] and spec.as_dict() == stored
    # what the scheduler and the rollouts read is what apply wrote
    assert derive(spec, "stored-task").jobs == jobs
    assert jobs[0]["registry_auth"]["password"] == "p-SECRET"


@pytest.mark.asyncio(loop_scope="module")
async def test_a_stored_service_reads_back_typed_with_its_replicas(server: RunningServer) -> None:
    conf = {
        "type": "service",
        "name": "stored-svc",
        "port": 8000,
        "commands": ["python3 -m http.server 8000"],
        "replicas": 2,
        "model": "my/model",
        "resources": RESOURCES,
    }
    stored, jobs = await _stored(server, {"configuration": conf})
    spec = run_spec.read(stored)
    assert spec.conf.type == "service" and spec.nodes == 1
    derived = derive(spec, "stored-svc")
    assert derived.jobs == jobs and [j["replica_num"] for j in jobs] == [0, 1]
    assert [t["replica_group"] for t in derived.templates] == ["0"]


def test_older_shaped_documents_still_read() -> None:
    # no profile, none of the fields normalize adds, a service's replica groups as a `replicas` list
    spec = run_spec.read(
        {
            "run_name": "old",
            "configuration": {
                "type": "service",
                "port": 80,
                "replicas": [{"name": "a", "replicas": 1, "commands": ["serve a"]}],
            },
        }
    )
    assert spec.conf.type == "service" and spec.profile.max_price is None
    assert [g.name for g in spec.conf.replica_groups] == ["a"]
    assert spec.merged.creation_policy is not None and spec.run_name == "old"
    task = run_spec.read({"configuration": {"type": "task", "commands": ["true"]}, "profile": None})
    assert task.nodes == 1 and task.run_name is None and task.priority == 0
