"""The server's side of container jobs, in process: what a job's configuration, its blocks of the instance
and the server's default image turn into for the agent, and the runtime data the API shows."""

from __future__ import annotations

import dataclasses
from typing import Any

from corral.agent.protocol import JobState, JobSubmission
from corral.agent.protocol_containers import ContainerInfo, ImagePullProgress
from corral.domain.records import InstanceRec, JobRec
from corral.domain.resources import Gpu, InstanceResources
from corral.domain.statuses import InstanceStatus, JobStatus
from corral.scheduler.codec import resources_to_json
from corral.services.serialize import job_submission
from corral.workers.jobs.container import apply_container, runtime_data, with_agent_state

A100 = Gpu(name="A100", memory_mib=81920, vendor="nvidia")
HOST = InstanceResources(cpus=8, memory_mib=65536, gpus=(A100,) * 4, spot=False, disk_size_mib=10**6)


def _inst(total_blocks: int = 1, resources: InstanceResources = HOST) -> InstanceRec:
    return InstanceRec(
        id="i", project_id="p", project_name="main", fleet_id="f", fleet_name="f", name="f-0", instance_num=0,
        status=InstanceStatus.BUSY, unreachable=False, backend="local", region="local", price=0.0,
        offer={"resources": resources_to_json(resources)}, total_blocks=total_blocks, busy_blocks=1, hostname="h",
        agent=None, created_at=0.0, started_at=0.0, finished_at=None, last_job_finished_at=None,
        idle_duration=None, termination_reason=None, termination_reason_message=None,
    )  # fmt: skip


def _job(blocks: int = 1, status: JobStatus = JobStatus.RUNNING, runtime: dict[str, Any] | None = None) -> JobRec:
    return JobRec(
        id="j", run_id="r", project_id="p", run_name="run", job_num=0, replica_num=0, job_name="run-0-0",
        submission_num=0, deployment_num=0, submitted_at=0.0, last_processed_at=0.0, finished_at=None,
        status=status, status_message=None, termination_reason=None, termination_reason_message=None,
        exit_status=None, job_spec={}, priority=0, instance_id="i", job_provisioning_data=None,
        job_runtime_data=runtime, stop_requested=None, disconnected_at=None, log_offset=0, wait_deadline=None,
        blocks=blocks,
    )  # fmt: skip


def _apply(
    conf: dict[str, Any], blocks: int = 1, total: int = 1, default: str | None = None, backend: str = "ssh"
) -> JobSubmission:
    sub = JobSubmission("j", "run", list(conf.get("commands") or []), shell=conf.get("shell"))
    apply_container(sub, _job(blocks), conf, dataclasses.replace(_inst(total), backend=backend), default)
    return sub


def test_whole_local_instance_gets_a_bridge_unless_multi_node() -> None:
    local = _apply({"image": "x", "commands": ["a"]}, backend="local").container
    assert local is not None and (local.network_mode, local.gpus) == ("bridge", -1)
    sub = JobSubmission("j", "run", ["a"])
    apply_container(sub, _job(), {"image": "x"}, _inst(1), None, nodes=2)
    assert sub.container is not None and sub.container.network_mode == "host"


def test_whole_instance_job() -> None:
    conf = {
        "image": "ubuntu:22.04",
        "user": "1000:1000",
        "privileged": True,
        "entrypoint": "python -c 'print(1)'",
        "commands": ["--x"],
        "ports": [{"local_port": 8000, "container_port": 8080}],
        "volumes": [
            {"instance_path": "/data", "path": "/mnt", "optional": False},
            {"name": "net-vol", "path": "/v"},
        ],
        "resources": {"shm_size": 1.5},
        "registry_auth": {"username": "u", "password": "p"},
    }
    sub = _apply(conf)
    assert (sub.image, sub.user, sub.shell) == ("ubuntu:22.04", "1000:1000", None)
    assert sub.entrypoint == ["python", "-c", "print(1)"]
    c = sub.container
    assert c is not None
    assert (c.network_mode, c.gpus, c.cpus, c.memory_mib) == ("host", -1, None, None)  # all GPUs, no limits
    assert (c.privileged, c.shm_size_mib, c.ports) == (True, 1536, [8080])
    assert [(v.instance_path, v.path) for v in c.volumes] == [("/data", "/mnt")]
    assert (c.registry_username, c.registry_password) == ("u", "p")
    assert JobSubmission.from_dict(sub.to_dict()) == sub  # valid on the wire


def test_job_on_blocks_gets_its_share() -> None:
    sub = _apply({"image": "x", "commands": ["a"]}, blocks=1, total=4)
    c = sub.container
    assert c is not None
    assert (c.network_mode, c.gpus, c.cpus, c.memory_mib) == ("bridge", 1, 2.0, 16384)
    two = _apply({"image": "x", "commands": ["a"]}, blocks=2, total=4).container
    assert two is not None and (two.gpus, two.cpus, two.memory_mib) == (2, 4.0, 32768)
    data = runtime_data(sub, "/workflow")
    assert data == {
        "network_mode": "bridge",
        "working_dir": "/workflow",
        "username": None,
        "ports": None,
        "offer": None,
        "cpu": 2.0,
        "gpu": 1,
        "memory": 16.0,
    }


def test_no_gpus_no_device_request_and_no_image_is_a_host_process() -> None:
    cpu_only = InstanceResources(cpus=2, memory_mib=4096, gpus=(), spot=False, disk_size_mib=10**5)
    sub = JobSubmission("j", "run", ["a"])
    apply_container(sub, _job(), {"image": "x"}, _inst(1, cpu_only), None)
    assert sub.container is not None and sub.container.gpus == 0
    host = _apply({"commands": ["a"], "user": "alice", "entrypoint": "echo hi"})
    assert host.image is None and host.container is None
    assert host.user == "alice"  # who a host process is inside its sandbox
    assert host.entrypoint == ["echo", "hi"]


def test_default_image_runs_under_bash_like_dstacks() -> None:
    sub = _apply({"commands": ["a"]}, default="corral/base:1")
    assert (sub.image, sub.shell) == ("corral/base:1", "bash")
    own = _apply({"commands": ["a"], "image": "alpine"}, default="corral/base:1")
    assert (own.image, own.shell) == ("alpine", None)  # the agent's default for an image: /bin/sh
    told = _apply({"commands": ["a"], "shell": "sh"}, default="corral/base:1")
    assert told.shell == "sh"


def test_runtime_data_follows_the_agent() -> None:
    data = runtime_data(_apply({"image": "x", "commands": ["a"]}, blocks=1, total=2), None)
    pulling = JobState("j", "pending", image_pull_progress=ImagePullProgress(10, 0, 100, False))
    during = with_agent_state(data, pulling)
    assert during["image_pull_progress"] == {
        "downloaded_bytes": 10,
        "extracted_bytes": 0,
        "total_bytes": 100,
        "is_total_bytes_final": False,
    }
    running = JobState("j", "running", container=ContainerInfo("c", "n", "bridge", {8080: 49153}))
    after = with_agent_state(during, running)
    assert after["ports"] == {"8080": 49153} and "image_pull_progress" not in after
    fallback = JobState("j", "running", container=ContainerInfo("c", "n", "host", {8080: 8080}))
    assert with_agent_state(during, fallback)["network_mode"] == "host"
    assert with_agent_state(during, fallback)["ports"] == {}  # dstack: empty with host networking


def test_api_shows_pull_progress_only_while_pulling() -> None:
    runtime = {"network_mode": "host", "ports": None, "image_pull_progress": {"downloaded_bytes": 1}}
    shown = job_submission(_job(status=JobStatus.PULLING, runtime=runtime))
    assert shown["image_pull_progress"] == {"downloaded_bytes": 1}
    assert "image_pull_progress" not in shown["job_runtime_data"]
    assert job_submission(_job(status=JobStatus.RUNNING, runtime=runtime))["image_pull_progress"] is None


def test_dstack_gpu_variables_give_a_blocks_job_its_share() -> None:
    from types import SimpleNamespace

    from corral.workers.jobs.nodes import job_env as _env

    run = SimpleNamespace(project_name="main", run_spec={"repo_id": "none"})
    whole = _env(_job(blocks=1), run, _inst(total_blocks=1), "127.0.0.1", ["127.0.0.1"])
    assert whole["DSTACK_GPUS_PER_NODE"] == "4"
    half = _env(_job(blocks=2), run, _inst(total_blocks=4), "127.0.0.1", ["127.0.0.1"])
    assert half["DSTACK_GPUS_PER_NODE"] == "2" and half["DSTACK_GPUS_NUM"] == "2"
