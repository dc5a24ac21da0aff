"""Fair share end to end: two projects share an SSH fleet of fake GPU hosts (two hosts with a fake
``nvidia-smi`` of 2 x A100 each, ``blocks: 2``: four one-GPU slots) through an export, with weights 1 and 3.
Both queue one-GPU jobs behind runs that hold every GPU; once those stop, the GPU-seconds each project gets
while both still wait come within 20 % of 1:3 (without fair share the queue's order, the older project's
jobs first, would give the first project everything), and the per-project queue-wait series is on /metrics."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ssh_harness import SSH_SETTINGS, delete_all_fleets, fleet_settled, ssh_fleet

from fakehosts import FakeHosts
from server_harness import RunningServer, make_settings, running_server, wait_for

#: Five seconds each: long against the second or so it takes a freed GPU to get its next job on a loaded
#: machine, so that those gaps do not decide the measured ratio.
JOB = ["echo S $(date +%s.%N)", "sleep 5", "echo E $(date +%s.%N)"]
A_JOBS, B_JOBS = 5, 12


async def _submit(c: httpx.AsyncClient, project: str, name: str, commands: list[str], gpu: int) -> None:
    configuration = {
        "type": "task",
        "name": name,
        "commands": commands,
        "resources": {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB..", "gpu": gpu},
    }
    body = {"force": False, "plan": {"run_spec": {"configuration": configuration}}}
    r = await c.post(f"/api/project/{project}/runs/apply", json=body)
    assert r.status_code == 200, r.text


async def _run(c: httpx.AsyncClient, project: str, name: str) -> dict[str, Any]:
    r = await c.post(f"/api/project/{project}/runs/get", json={"run_name": name})
    assert r.status_code == 200, r.text
    return dict(r.json())


async def _times(c: httpx.AsyncClient, project: str, run: dict[str, Any]) -> tuple[float, float]:
    """When the job started and ended, as it printed them."""
    body = {
        "run_name": run["run_spec"]["run_name"],
        "job_submission_id": run["latest_job_submission"]["id"],
        "limit": 100,
    }
    logs = (await c.post(f"/api/project/{project}/logs/poll", json=body)).json()["logs"]
    words = b"".join(base64.b64decode(x["message"]) for x in logs).decode().split()
    return float(words[words.index("S") + 1]), float(words[words.index("E") + 1])


@pytest.fixture
async def server(tmp_path: Path, hosts: FakeHosts) -> AsyncIterator[RunningServer]:
    """The SSH tests' server, with /metrics on."""
    async with running_server(make_settings(tmp_path, enable_prometheus_metrics=True, **SSH_SETTINGS)) as s:
        yield s
        async with s.client() as c:
            await delete_all_fleets(c)


async def test_weights_one_to_three_give_gpu_seconds_one_to_three(
    two_gpu_hosts: list[str], server: RunningServer, hosts: FakeHosts
) -> None:
    async with server.client() as c:
        assert (await c.post("/api/projects/create", json={"project_name": "team-b"})).status_code == 200
        for project, weight in (("main", 1), ("team-b", 3)):
            r = await c.post(f"/api/projects/{project}/quotas/set", json={"weight": weight})
            assert r.status_code == 200, r.text
        conf = ssh_fleet(hosts, "gpus", two_gpu_hosts, blocks=2)
        body = {"force": False, "plan": {"spec": {"configuration": conf, "profile": {}}}}
        assert (await c.post("/api/project/main/fleets/apply", json=body)).status_code == 200
        await wait_for(lambda: fleet_settled(c, "gpus", 2), timeout=90)
        share = {"name": "share", "importer_projects": ["team-b"], "exported_fleets": ["gpus"]}
        assert (await c.post("/api/project/main/exports/create", json=share)).status_code == 200

        # two runs hold every GPU while both projects queue: main's jobs first (the older ones)
        for i in range(2):
            await _submit(c, "main", f"hold-{i}", ["sleep 600"], gpu=2)

        async def holding() -> bool:
            runs = [await _run(c, "main", f"hold-{i}") for i in range(2)]
            return all(x["status"] == "running" for x in runs)

        await wait_for(holding, timeout=60)
        a = [f"a-{i}" for i in range(A_JOBS)]
        b = [f"b-{i}" for i in range(B_JOBS)]
        for name in a:
            await _submit(c, "main", name, JOB, gpu=1)
        for name in b:
            await _submit(c, "team-b", name, JOB, gpu=1)

        async def queued() -> list[dict[str, Any]] | None:
            q = (await c.post("/api/scheduling/queue", json={})).json()
            return list(q) if len(q) == A_JOBS + B_JOBS else None

        queue = await wait_for(queued, timeout=30)
        # main holds every GPU: its jobs wait for fair share (team-b is further below its entitlement),
        # team-b's for capacity
        reasons = {p: {e["reason"] for e in queue if e["project_name"] == p} for p in ("main", "team-b")}
        assert reasons == {"main": {"fair_share"}, "team-b": {"capacity"}}, queue
        r = await c.post("/api/project/main/runs/stop", json={"runs_names": ["hold-0", "hold-1"], "abort": True})
        assert r.status_code == 200, r.text

        async def finished() -> list[tuple[str, dict[str, Any]]] | None:
            runs = await asyncio.gather(*(_run(c, p, n) for p, names in (("main", a), ("team-b", b)) for n in names))
            if any(x["status"] not in ("done", "failed", "terminated", "aborted") for x in runs):
                return None
            return [("main" if x["run_spec"]["run_name"].startswith("a-") else "team-b", x) for x in runs]

        runs = await wait_for(finished, timeout=150, interval=0.5)
        assert all(x["status"] == "done" for _, x in runs), [x["latest_job_submission"] for _, x in runs]
        times: dict[str, list[tuple[float, float]]] = {"main": [], "team-b": []}
        for project, run in runs:
            times[project].append(await _times(c, project, run))

        # the contended window: from the first start until either project's last job started (its queue
        # was empty from then on)
        start = min(s for spans in times.values() for s, _ in spans)
        end = min(max(s for s, _ in spans) for spans in times.values())
        held = {p: sum(max(0.0, min(e, end) - max(s, start)) for s, e in spans) for p, spans in times.items()}
        ratio = held["team-b"] / held["main"]
        assert 3 * 0.8 <= ratio <= 3 * 1.2, (ratio, held, end - start, times)

        metrics = (await c.get("/metrics")).text
        for project in ("main", "team-b"):
            assert f'corral_queue_wait_seconds_count{{project="{project}"}}' in metrics
        # main's weight 1 is the default (no policy); team-b's 3 is a policy
        assert 'corral_project_weighted_share{project="team-b"}' in metrics
