"""Job metrics end to end (real server, local agents, a fake ``nvidia-smi`` reporting two GPUs): a CPU-busy
task given one GPU reports CPU above 20 % and memory above zero within a few samples, newest first,
``limit`` honoured (default one sample), and its GPU's series from the host's ``nvidia-smi`` query; dstack's
errors for a missing job and a bad query."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from server_harness import fleet_body, make_settings, running_server, task_body, wait_for

GPU = {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB..", "gpu": 1}
BUSY = "while :; do :; done"
M = "/api/project/main/metrics/job/"


def fake_nvidia_smi(bin_dir: Path) -> None:
    """Two H200s; the sampling query reports GPU 0 at 1234 MiB and 56 %, GPU 1 at 2000 MiB and 7 %."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        "  *utilization.gpu*) echo '0, 1234, 56'; echo '1, 2000, 7' ;;\n"
        "  *) echo 'NVIDIA H200, 143771, 550.54.15'; echo 'NVIDIA H200, 143771, 550.54.15' ;;\n"
        "esac\n"
    )
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)


def series(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in body["metrics"]}


async def _samples(c: httpx.AsyncClient, run: str, n: int) -> dict[str, dict[str, Any]]:
    async def check() -> dict[str, dict[str, Any]] | None:
        r = await c.get(M + run, params={"limit": n})
        assert r.status_code == 200, r.text
        found = series(r.json())
        # every sample of the window has its GPU values (a sample of a host too busy to answer has none)
        return (
            found if found and len(found["cpu_usage_percent"]["values"]) == n and "gpus_detected_num" in found else None
        )

    return dict(await wait_for(check, timeout=40, interval=0.3))


async def test_busy_and_gpu_jobs_report_dstacks_series(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvidia_smi(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("CORRAL_AGENT_METRICS_INTERVAL", "0.3")
    settings = make_settings(
        tmp_path, agent_poll_wait=1.0, enable_prometheus_metrics=True, prometheus_auth_token="prom-token"
    )
    async with running_server(settings) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..2", resources=GPU))
        body = task_body([BUSY], name="busy", resources=GPU, fleets=["fl"])
        assert (await c.post("/api/project/main/runs/apply", json=body)).status_code == 200

        busy = await _samples(c, "busy", 3)
        cpu = busy["cpu_usage_percent"]
        assert len(cpu["timestamps"]) == 3 and cpu["timestamps"] == sorted(cpu["timestamps"], reverse=True)
        assert max(cpu["values"]) > 20, cpu
        assert all(v > 0 for v in busy["memory_usage_bytes"]["values"])
        assert all(v > 0 for v in busy["memory_working_set_bytes"]["values"])
        assert busy["cpus_detected_num"]["values"][0] >= 1 and busy["memory_total_bytes"]["values"][0] > 0
        one = series((await c.get(M + "busy")).json())  # dstack's default limit: one sample
        assert len(one["cpu_usage_percent"]["values"]) == 1

        # the job was given one of the host's two GPUs: its values, numbered within the job
        assert busy["gpus_detected_num"]["values"] == [1, 1, 1]
        assert [k for k in busy if k.startswith("gpu_util_percent")] == ["gpu_util_percent_gpu0"]
        util = busy["gpu_util_percent_gpu0"]["values"][0]
        assert util in (56, 7)
        assert busy["gpu_memory_usage_bytes_gpu0"]["values"][0] == (1234 if util == 56 else 2000) * 2**20
        assert busy["gpu_memory_total_bytes"]["values"][0] == 143771 * 2**20

        missing = await c.get(M + "busy", params={"job_num": 3})
        assert missing.status_code == 400 and missing.json()["detail"][0]["code"] == "resource_not_exists"
        assert "Found no job with given parameters" in missing.text
        bad = await c.get(M + "busy", params={"limit": "many"})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "limit"]
        await _scrape(c)
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["busy"], "abort": True})


async def _scrape(c: httpx.AsyncClient) -> None:
    """``/metrics`` with the token: dstack's names and labels (parsed by ``prometheus_client``) and corral's."""
    assert (await c.get("/metrics", headers={"Authorization": ""})).json()["detail"]["msg"] == "Access denied"
    wrong = await c.get("/metrics", headers={"Authorization": "Bearer nope"})
    assert (wrong.status_code, wrong.json()["detail"]["msg"]) == (403, "Invalid token")
    r = await c.get("/metrics", headers={"Authorization": "Bearer prom-token"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    job = families["dstack_job_cpu_time_seconds"].samples[0]  # the parser drops a counter's _total
    assert job.labels["dstack_run_name"] == "busy" and job.labels["dstack_run_type"] == "task" and job.value > 0
    assert set(job.labels) == {
        "dstack_project_name", "dstack_user_name", "dstack_run_name", "dstack_run_id", "dstack_job_name",
        "dstack_job_id", "dstack_job_num", "dstack_replica_num", "dstack_run_type", "dstack_backend", "dstack_gpu",
    }  # fmt: skip
    ratio = families["dstack_job_gpu_usage_ratio"].samples[0]
    assert ratio.labels["dstack_gpu_num"] == "0" and ratio.value in (0.56, 0.07)
    assert families["dstack_job_memory_usage_bytes"].samples[0].value > 0
    runs = families["dstack_run_count"].samples[0]
    assert (runs.labels, runs.value) == ({"dstack_project_name": "main", "dstack_user_name": "admin"}, 1)
    inst = families["dstack_instance_gpu_count"].samples[0]
    assert inst.value == 1 and inst.labels["dstack_fleet_name"] == "fl" and inst.labels["dstack_gpu"] == "H200"
    assert families["corral_placements"].samples[0].value >= 1
    waits = families["corral_queue_wait_seconds"]
    assert waits.type == "histogram" and any(s.name.endswith("_count") and s.value >= 1 for s in waits.samples)
    provision = families["dstack_submit_to_provision_duration_seconds"].samples[0]
    assert provision.labels["project_name"] == "main" and provision.labels["run_type"] == "task"
