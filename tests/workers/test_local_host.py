"""The local backend is one host split into blocks: each local instance is carved out of what the machine
has free, and none is created when it does not fit (real server, agents and a fake ``nvidia-smi``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest

from server_harness import fleet_body, make_settings, running_server, task_body, wait_for

GIB = 1024


async def _run(c: httpx.AsyncClient, name: str) -> dict[str, Any]:
    return dict((await c.post("/api/project/main/runs/get", json={"run_name": name})).json())


async def _status(c: httpx.AsyncClient, name: str, *statuses: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        run = await _run(c, name)
        return run if run["status"] in statuses else None

    return dict(await wait_for(check, timeout=60))


def _fake_one_gpu(bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200, 143771, 550.54.15'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


async def test_two_jobs_wanting_the_only_gpu_run_one_after_the_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_one_gpu(tmp_path / "bin", monkeypatch)
    spans = tmp_path / "spans"
    gpu = {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB..", "gpu": 1}
    command = f"echo start $(date +%s.%N) >> {spans}; sleep 2; echo end $(date +%s.%N) >> {spans}"
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..4", resources=gpu))
        for name in ("gpu-a", "gpu-b"):
            r = await c.post("/api/project/main/runs/apply", json=task_body([command], name=name, resources=gpu))
            assert r.status_code == 200, r.text
        await _status(c, "gpu-a", "running")
        waiting = (await _status(c, "gpu-b", "submitted"))["latest_job_submission"]["corral_waiting"]
        assert "this machine has 0 of its 1 blocks free" in waiting, waiting
        for name in ("gpu-a", "gpu-b"):
            assert (await _status(c, name, "done", "failed"))["status"] == "done"
        instances = (await c.post("/api/instances/list", json={})).json()
        assert [len(i["instance_type"]["resources"]["gpus"]) for i in instances] == [1]  # one, reused
    events = [line.split() for line in spans.read_text().splitlines()]
    assert [e[0] for e in events] == ["start", "end", "start", "end"], events  # never together
    assert float(events[1][1]) <= float(events[2][1])


async def test_local_instances_are_carved_out_of_the_machine(tmp_path: Path) -> None:
    # a machine of 2 CPUs and 4 GB: 2 blocks of 1 CPU and 2 GB; the disk is shared
    settings = make_settings(tmp_path, local_cpus=2, local_memory_mib=4 * GIB)
    async with running_server(settings) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..3"))
        for i in range(3):
            await c.post("/api/project/main/runs/apply", json=task_body(["sleep 60"], name=f"r{i}"))
        await _status(c, "r0", "running")
        await _status(c, "r1", "running")
        waiting = (await _status(c, "r2", "submitted"))["latest_job_submission"]["corral_waiting"]
        assert waiting == (
            "Waiting for capacity: fleet 'fl': this machine has 0 of its 2 blocks free "
            "and a local instance for the job needs 1"
        )
        instances = (await c.post("/api/instances/list", json={})).json()
        shares = sorted(
            (i["instance_type"]["resources"]["cpus"], i["instance_type"]["resources"]["memory_mib"]) for i in instances
        )
        assert shares == [(1, 2 * GIB), (1, 2 * GIB)]
        # more than the whole machine can never run: it fails at once, saying what is missing
        r = await c.post(
            "/api/project/main/runs/apply", json=task_body(["true"], name="huge", resources={"cpu": "3.."})
        )
        assert r.status_code == 200
        huge = (await _status(c, "huge", "failed"))["latest_job_submission"]
        assert huge["termination_reason"] == "failed_to_start_due_to_no_capacity"
        assert "No fleet can ever run this job" in huge["termination_reason_message"]
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["r0", "r1", "r2"], "abort": True})
        await _status(c, "r2", "terminated")


def test_the_local_host_settings_are_read_and_checked() -> None:
    from corral.settings import Settings, SettingsError

    env = {"CORRAL_SERVER_DIR": "state", "CORRAL_LOCAL_CPUS": "4", "CORRAL_LOCAL_MEMORY": "16GB"}
    s = Settings.from_env({**env, "CORRAL_LOCAL_BLOCKS": "2"})
    assert (s.local_cpus, s.local_memory_mib, s.local_blocks) == (4, 16 * GIB, 2)
    for var, bad in (("CORRAL_LOCAL_CPUS", "two"), ("CORRAL_LOCAL_BLOCKS", "0"), ("CORRAL_LOCAL_MEMORY", "lots")):
        with pytest.raises(SettingsError, match=var):
            Settings.from_env({**env, var: bad})


async def test_a_job_whose_port_is_taken_fails_naming_it(tmp_path: Path) -> None:
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        async with running_server(make_settings(tmp_path)) as s, s.client() as c:
            await c.post("/api/project/main/fleets/apply", json=fleet_body())
            body = task_body(["echo should not run"], name="clash", ports=[port])
            assert (await c.post("/api/project/main/runs/apply", json=body)).status_code == 200
            run = await _status(c, "clash", "failed")
            sub = run["latest_job_submission"]
            assert sub["termination_reason"] == "ports_binding_failed", sub
            assert f"Port {port} of the job's `ports` is already in use" in sub["termination_reason_message"]


async def test_an_idle_instance_holding_the_machine_is_reclaimed_for_a_bigger_job(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, local_cpus=2, local_memory_mib=4 * GIB)
    async with running_server(settings) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..3"))
        await c.post("/api/project/main/runs/apply", json=task_body(["true"], name="small"))
        assert (await _status(c, "small", "done", "failed"))["status"] == "done"
        both = {"cpu": "2..", "memory": "0.1GB..", "disk": "1GB.."}
        await c.post("/api/project/main/runs/apply", json=task_body(["true"], name="big", resources=both))
        assert (await _status(c, "big", "done", "failed"))["status"] == "done"
        instances = (await c.post("/api/instances/list", json={})).json()
        by_cpus = {i["instance_type"]["resources"]["cpus"]: i for i in instances}
        assert by_cpus[1]["status"] == "terminated" and by_cpus[1]["termination_reason"] == "idle_timeout"
        assert by_cpus[2]["status"] == "idle"
