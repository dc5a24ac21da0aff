"""Each local instance owns specific GPUs of the machine: two instances of one GPU each never share
one, their agents report and their jobs see only their own, and the ownership outlives a server
restart (real server and agents, a fake ``nvidia-smi`` reporting two GPUs)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest

from server_harness import fleet_body, make_settings, running_server, task_body, wait_for

GPU = {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB..", "gpu": 1}


def _fake_two_gpus(bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200, 143771, 550.54.15'\necho 'NVIDIA H200, 143771, 550.54.15'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


async def _status(c: httpx.AsyncClient, name: str, *statuses: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        run = (await c.post("/api/project/main/runs/get", json={"run_name": name})).json()
        return dict(run) if run["status"] in statuses else None

    return dict(await wait_for(check, timeout=60))


async def _seen(out: Path, name: str) -> list[str]:
    """What job ``name`` wrote: its CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES and DSTACK_GPUS_NUM."""
    path = out / name

    async def check() -> list[str] | None:
        return path.read_text().split() if path.exists() and path.read_text().endswith("\n") else None

    return list(await wait_for(check, timeout=30))


async def test_two_one_gpu_instances_own_different_gpus_across_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_two_gpus(tmp_path / "bin", monkeypatch)
    out = tmp_path / "out"
    out.mkdir()
    command = (
        f'echo "$CUDA_VISIBLE_DEVICES $NVIDIA_VISIBLE_DEVICES $DSTACK_GPUS_NUM" > {out}/$DSTACK_RUN_NAME; '
        f"while [ ! -e {out}/release-$DSTACK_RUN_NAME ]; do sleep 0.1; done"
    )
    settings = make_settings(tmp_path)
    async with running_server(settings) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..4", resources=GPU))
        # a second fleet: its job can never reuse an instance of the first, only a new carve of the machine
        await c.post("/api/project/main/fleets/apply", json=fleet_body(name="gpus-b", nodes="0..2", resources=GPU))
        for name in ("gpu-a", "gpu-b"):
            body = task_body([command], name=name, resources=GPU, fleets=["fl"])
            assert (await c.post("/api/project/main/runs/apply", json=body)).status_code == 200
        await _status(c, "gpu-a", "running")
        await _status(c, "gpu-b", "running")  # both at once, each on an instance of its own
        a, b = await _seen(out, "gpu-a"), await _seen(out, "gpu-b")
        assert sorted([a, b]) == [["0", "0", "1"], ["1", "1", "1"]], (a, b)
        instances = (await c.post("/api/instances/list", json={})).json()
        assert [len(i["instance_type"]["resources"]["gpus"]) for i in instances] == [1, 1]
        # a third job wanting a GPU waits: the machine's two GPUs are held
        body = task_body([command], name="gpu-c", resources=GPU, fleets=["gpus-b"])
        assert (await c.post("/api/project/main/runs/apply", json=body)).status_code == 200

        async def waiting() -> str | None:
            sub = (await _status(c, "gpu-c", "submitted"))["latest_job_submission"]
            return sub["corral_waiting"] if sub.get("corral_waiting") else None

        assert "this machine has 0 of its 2 blocks free" in await wait_for(waiting, timeout=30)
        for compute in s.ctx.computes.values():  # the harness's teardown would stop the agents
            compute.reap_unknown = _keep  # type: ignore[method-assign]
    # the server restarts; the agents and their jobs go on, each keeping its GPU
    async with running_server(settings) as s2, s2.client() as c2:
        assert (await _status(c2, "gpu-c", "submitted"))["status"] == "submitted"
        # the job on GPU 1 ends; its idle instance is reclaimed for gpu-c, whose new instance must get
        # GPU 1 -- the one the instance still running the other job on GPU 0 does not own
        on_gpu_1, on_gpu_0 = ("gpu-a", "gpu-b") if a[0] == "1" else ("gpu-b", "gpu-a")
        (out / f"release-{on_gpu_1}").touch()
        ended = await _status(c2, on_gpu_1, "done", "failed")
        assert ended["status"] == "done", {
            k: v for k, v in ended["latest_job_submission"].items() if "reason" in k or "status" in k or "exit" in k
        }
        assert await _seen(out, "gpu-c") == ["1", "1", "1"]
        assert (await _status(c2, on_gpu_0, "running"))["status"] == "running"
        for name in (on_gpu_0, "gpu-c"):
            (out / f"release-{name}").touch()
        for name in (on_gpu_0, "gpu-c"):
            assert (await _status(c2, name, "done", "failed"))["status"] == "done", name


async def _keep(_known: set[str]) -> list[str]:
    return []
