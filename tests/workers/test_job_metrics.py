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
    settings = make_settings(tmp_path, agent_poll_wait=1.0)
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
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["busy"], "abort": True})
