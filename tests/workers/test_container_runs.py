"""Runs with an ``image`` end to end: a real server (local backend) whose agents run containers on the
test Docker engine. The seed's exact ``runs/apply`` body, limits and ports of a job on blocks, the server's
default image, the ``pulling`` status with progress, pull failures and stops, with nothing left behind."""

from __future__ import annotations

import base64
import copy
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.agent.containers import LABEL_RUN
from docker_harness import DEFAULT_IMAGE, REGISTRY_USER, UBUNTU, DockerEngine, Registries, SlowProxy
from server_harness import (
    SEED_BODY,
    SEED_FLEET,
    RunningServer,
    finished_run,
    fleet_body,
    get_run,
    make_settings,
    running_server,
    wait_for,
)


@pytest.fixture
async def server(tmp_path: Path, docker_engine: DockerEngine) -> AsyncIterator[RunningServer]:
    async with running_server(make_settings(tmp_path, docker_host=docker_engine.host)) as s:
        yield s
    assert docker_engine.containers("corral.agent") == [], "a container outlived its server and agents"


async def _logs(c: httpx.AsyncClient, run: dict[str, Any]) -> str:
    sub = run["latest_job_submission"]["id"]
    r = await c.post(
        "/api/project/main/logs/poll",
        json={"run_name": run["run_spec"]["run_name"], "job_submission_id": sub, "limit": 1000},
    )
    return b"".join(base64.b64decode(x["message"]) for x in r.json()["logs"]).decode()


def _task(commands: list[str], **conf: Any) -> dict[str, Any]:
    configuration = {"type": "task", "commands": commands, "resources": {"cpu": "1..", "memory": "0.1GB.."}}
    configuration.update(conf)
    return {"force": False, "plan": {"run_spec": {"configuration": configuration}}}


async def test_seed_body_runs_in_a_container(server: RunningServer, docker_engine: DockerEngine) -> None:
    body = copy.deepcopy(SEED_BODY)
    body["plan"]["run_spec"]["configuration"]["image"] = "ubuntu:22.04"  # the seed's exact body
    async with server.client() as c:
        assert (await c.post("/api/project/main/fleets/apply", json=fleet_body(**SEED_FLEET))).status_code == 200
        r = await c.post("/api/project/main/runs/apply", json=body)
        assert r.status_code == 200, r.text
        name = r.json()["run_spec"]["run_name"]
        assert r.json()["jobs"][0]["job_spec"]["image_name"] == "ubuntu:22.04"

        async def in_container() -> bool:
            return bool(docker_engine.containers(f"{LABEL_RUN}={name}"))

        await wait_for(in_container, timeout=30)  # the job's commands run in a container of the image
        got = await finished_run(c, name)
        assert got["status"] == "done", got["latest_job_submission"]
        sub = got["latest_job_submission"]
        assert (sub["termination_reason"], sub["exit_status"]) == ("done_by_runner", 0)
        # its instance is carved out of the machine (2 of its 16 blocks): the container is held to that share
        inst = (await c.post("/api/instances/list", json={})).json()[0]
        assert inst["instance_type"]["resources"]["cpus"] == 2
        assert sub["job_runtime_data"]["network_mode"] == "bridge"  # a share of the machine: no port clash
        assert sub["job_runtime_data"]["memory"] == round(inst["instance_type"]["resources"]["memory_mib"] / 1024, 3)
        dates = (await _logs(c, got)).splitlines()
        assert len(dates) == 2 and all(" UTC " in d for d in dates), dates  # `date`, `sleep 6`, `date`
        assert docker_engine.containers(f"{LABEL_RUN}={name}") == []


async def test_job_on_blocks_gets_limits_ports_and_its_gpu_share(
    server: RunningServer, docker_engine: DockerEngine
) -> None:
    probe = [
        "echo mem=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes)",
        "echo quota=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us)",
        "echo gpus=$DSTACK_GPUS_PER_NODE",
        "sleep 1",  # published ports exist only while the container runs: let the agent see them
    ]
    async with server.client() as c:
        # an instance of 2 CPUs carved out of the machine, split into 2 blocks: the job gets one
        resources = {"cpu": "2..", "memory": "0.1GB..", "disk": "1GB.."}
        await c.post("/api/project/main/fleets/apply", json=fleet_body(blocks=2, resources=resources))
        run = (await c.post("/api/project/main/runs/apply", json=_task(probe, image=UBUNTU, ports=[8080]))).json()
        got = await finished_run(c, run["run_spec"]["run_name"])
        assert got["status"] == "done", got["latest_job_submission"]
        inst = (await c.post("/api/instances/list", json={})).json()[0]
        memory_mib, cpus = inst["instance_type"]["resources"]["memory_mib"], inst["instance_type"]["resources"]["cpus"]
        out = await _logs(c, got)
        assert f"mem={memory_mib // 2 * 2**20}\n" in out  # one block of two: half the memory...
        assert f"quota={cpus // 2 * 100000}\n" in out  # ...and half the CPUs
        assert "gpus=0\n" in out
        runtime = got["latest_job_submission"]["job_runtime_data"]
        assert runtime["network_mode"] == "bridge" and runtime["memory"] == round(memory_mib // 2 / 1024, 3)
        assert list(runtime["ports"]) == ["8080"] and runtime["ports"]["8080"] > 0


async def test_default_image_for_jobs_without_one(tmp_path: Path, docker_engine: DockerEngine) -> None:
    settings = make_settings(tmp_path, docker_host=docker_engine.host, default_image=DEFAULT_IMAGE)
    async with running_server(settings) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body())
        plan = (await c.post("/api/project/main/runs/get_plan", json=_task(["true"])["plan"])).json()
        assert plan["job_plans"][0]["job_spec"]["image_name"] == DEFAULT_IMAGE
        run = (
            await c.post(
                "/api/project/main/runs/apply", json=_task(["cat /etc/corral-image", "echo ${SHELL_NAME:-sh}"])
            )
        ).json()
        got = await finished_run(c, run["run_spec"]["run_name"])
        assert got["status"] == "done", got["latest_job_submission"]
        assert await _logs(c, got) == "default\nbash\n"  # in the default image, under bash as in dstack's


async def test_pulling_status_with_progress_then_running(server: RunningServer, registries: Registries) -> None:
    proxy = SlowProxy(registries.private.address, delay=2.0)
    try:
        image = registries.push(registries.private, "slow-private:1", size=2**20)
        image = image.replace(registries.private.address, proxy.address)
        user, password = REGISTRY_USER
        auth = {"username": user, "password": password}
        async with server.client() as c:
            await c.post("/api/project/main/fleets/apply", json=fleet_body())
            body = _task(["echo pulled and ran"], image=image, registry_auth=auth)
            run = (await c.post("/api/project/main/runs/apply", json=body)).json()
            name = run["run_spec"]["run_name"]
            assert run["jobs"][0]["job_spec"]["registry_auth"] == auth

            async def pulling() -> dict[str, Any] | None:
                sub = (await get_run(c, name))["latest_job_submission"]
                return sub if sub["status"] == "pulling" and sub["image_pull_progress"] is not None else None

            sub = await wait_for(pulling, timeout=30)
            assert set(sub["image_pull_progress"]) == {
                "downloaded_bytes",
                "extracted_bytes",
                "total_bytes",
                "is_total_bytes_final",
            }
            got = await finished_run(c, name)
            assert got["status"] == "done", got["latest_job_submission"]
            assert got["latest_job_submission"]["image_pull_progress"] is None
            assert await _logs(c, got) == "pulled and ran\n"
    finally:
        proxy.stop()


async def test_pull_failure_fails_the_run_clearly(server: RunningServer, registries: Registries) -> None:
    async with server.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body())
        missing = f"{registries.open.address}/not-there:1"
        r = await c.post("/api/project/main/runs/apply", json=_task(["true"], image=missing))
        assert r.status_code == 200  # unlike dstack, no registry is asked at apply time
        got = await finished_run(c, r.json()["run_spec"]["run_name"])
        sub = got["latest_job_submission"]
        assert (got["status"], got["termination_reason"]) == ("failed", "job_failed")
        assert sub["termination_reason"] == "creating_container_error"
        assert sub["termination_reason_message"].startswith(f"Image `{missing}` was not found in its registry")
        r = await c.post("/api/project/main/runs/apply", json=_task(["true"], image="127.0.0.1:1/x:1"))
        sub = (await finished_run(c, r.json()["run_spec"]["run_name"]))["latest_job_submission"]
        assert sub["termination_reason"] == "creating_container_error"
        assert "the registry 127.0.0.1:1 is unreachable" in sub["termination_reason_message"]


async def test_stop_removes_the_container(server: RunningServer, docker_engine: DockerEngine) -> None:
    async with server.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body())
        run = (await c.post("/api/project/main/runs/apply", json=_task(["echo up", "sleep 600"], image=UBUNTU))).json()
        name = run["run_spec"]["run_name"]

        async def up() -> bool:
            got = await get_run(c, name)
            return got["status"] == "running" and "up" in await _logs(c, got)

        await wait_for(up, timeout=30)
        assert len(docker_engine.containers(f"{LABEL_RUN}={name}")) == 1
        await c.post("/api/project/main/runs/stop", json={"runs_names": [name], "abort": False})
        got = await finished_run(c, name)
        assert (got["status"], got["latest_job_submission"]["termination_reason"]) == (
            "terminated",
            "terminated_by_user",
        )
        assert docker_engine.containers(f"{LABEL_RUN}={name}") == []


async def test_containers_of_a_dead_agent_are_removed_with_its_instance(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    settings = make_settings(tmp_path, docker_host=docker_engine.host)
    async with running_server(settings) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body())
        run = (await c.post("/api/project/main/runs/apply", json=_task(["echo up", "sleep 600"], image=UBUNTU))).json()
        name = run["run_spec"]["run_name"]

        async def up() -> bool:
            got = await get_run(c, name)
            return got["status"] == "running" and "up" in await _logs(c, got)

        await wait_for(up, timeout=30)
        (work_dir,) = [d for d in settings.instances_dir.iterdir() if (d / "agent.pid").exists()]
        os.killpg(int((work_dir / "agent.pid").read_text()), signal.SIGKILL)  # the agent cannot clean up
        assert len(docker_engine.containers(f"{LABEL_RUN}={name}")) == 1
    # The server's shutdown reaps the instance it no longer follows; its containers go with it.
    assert docker_engine.containers(f"{LABEL_RUN}={name}") == []
