"""In-process units of the container path: the create body (GPU device requests included, since no
NVIDIA runtime exists here), image references, pull error wording, pull progress, wire validation."""

from __future__ import annotations

import re
from typing import Any

import pytest

from corral.agent.containers import container_config, device_requests, published_ports
from corral.agent.docker import Docker, DockerUnavailable, parse_timestamp, registry_auth_header
from corral.agent.images import PullTracker, pull_failure_message, registry_of, split_image
from corral.agent.protocol import JobState, JobSubmission, ProtocolError
from corral.agent.protocol_containers import ContainerInfo, ContainerSpec, ImagePullProgress, InstanceMount


def _sub(**kw: Any) -> JobSubmission:
    base: dict[str, Any] = {"job_id": "j1", "run_name": "r", "commands": ["echo a", "echo b"], "image": "img:1"}
    base.update(kw)
    return JobSubmission.from_dict(base)


def test_gpu_device_requests() -> None:
    assert device_requests(0, []) == []
    assert device_requests(-1, []) == [{"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]}]
    assert device_requests(2, ["1", "3"]) == [
        {"Driver": "nvidia", "Count": 0, "DeviceIDs": ["1", "3"], "Capabilities": [["gpu"]]}
    ]
    whole = container_config(_sub(container={"gpus": -1}), {}, "host", [])
    assert whole["HostConfig"]["DeviceRequests"] == device_requests(-1, [])
    share = container_config(_sub(container={"gpus": 1}), {}, "bridge", ["2"])
    assert share["HostConfig"]["DeviceRequests"][0]["DeviceIDs"] == ["2"]
    assert "DeviceRequests" not in container_config(_sub(), {}, "host", [])["HostConfig"]


def test_create_body_for_a_whole_instance_job() -> None:
    sub = _sub(
        env={"A": "1", "DSTACK_RUN_NAME": "r"},
        user="1000:1000",
        working_dir="/srv",
        shell="bash",
        container={
            "privileged": True,
            "shm_size_mib": 512,
            "ports": [8080],
            "volumes": [
                {"instance_path": "/data", "path": "/mnt/data"},
                {"instance_path": "/nope", "path": "/mnt/nope", "optional": True},
                {"instance_path": "/here", "path": "/mnt/here", "optional": True},
            ],
        },
    )
    body = container_config(sub, {"corral.job_id": "j1"}, "host", [], path_exists=lambda p: p == "/here")
    assert body["Image"] == "img:1" and body["Labels"] == {"corral.job_id": "j1"}
    assert (body["Entrypoint"], body["Cmd"]) == (["/bin/bash"], ["-c", "echo a && echo b"])
    assert body["Env"] == ["A=1", "DSTACK_RUN_NAME=r"]
    assert (body["User"], body["WorkingDir"]) == ("1000:1000", "/srv")
    host = body["HostConfig"]
    assert host["Init"] is True and host["Privileged"] is True and host["NetworkMode"] == "host"
    assert host["ShmSize"] == 512 * 2**20
    assert host["Mounts"] == [
        {"Type": "bind", "Source": "/data", "Target": "/mnt/data"},
        {"Type": "bind", "Source": "/here", "Target": "/mnt/here"},
    ]
    assert not {"Memory", "NanoCpus", "PortBindings"} & set(host)  # no limits, host networking
    assert "ExposedPorts" not in body


def test_create_body_for_a_job_on_blocks() -> None:
    sub = _sub(container={"network_mode": "bridge", "ports": [8080, 9000], "cpus": 1.5, "memory_mib": 2048})
    body = container_config(sub, {}, "bridge", [])
    host = body["HostConfig"]
    assert (host["NanoCpus"], host["Memory"], host["MemorySwap"]) == (1_500_000_000, 2**31, 2**31)
    assert host["NetworkMode"] == "bridge"
    assert host["PortBindings"] == {f"{p}/tcp": [{"HostIp": "", "HostPort": ""}] for p in (8080, 9000)}
    assert body["ExposedPorts"] == {"8080/tcp": {}, "9000/tcp": {}}
    assert (body["Entrypoint"], body["Cmd"]) == (["/bin/sh"], ["-c", "echo a && echo b"])  # dstack: sh in an image
    assert "User" not in body and "WorkingDir" not in body  # the image's own


def test_create_body_commands_entrypoint_and_working_dir() -> None:
    ep = container_config(_sub(entrypoint=["python", "-m", "x"], commands=["--flag"]), {}, "host", [])
    assert (ep["Entrypoint"], ep["Cmd"]) == (["python"], ["-m", "x", "--flag"])
    own = container_config(_sub(commands=[]), {}, "host", [])
    assert "Entrypoint" not in own and "Cmd" not in own  # the image's ENTRYPOINT and CMD
    assert container_config(_sub(shell="/usr/bin/zsh"), {}, "host", [])["Entrypoint"] == ["/usr/bin/zsh"]


def test_published_ports() -> None:
    spec = ContainerSpec(ports=[8080, 22])
    assert published_ports({}, spec, "host") == {8080: 8080, 22: 22}
    inspected = {
        "NetworkSettings": {
            "Ports": {
                "8080/tcp": [{"HostIp": "0.0.0.0", "HostPort": "49153"}, {"HostIp": "::", "HostPort": "49153"}],
                "22/tcp": None,
                "53/udp": [{"HostPort": "5353"}],
            }
        }
    }
    assert published_ports(inspected, spec, "bridge") == {8080: 49153}


@pytest.mark.parametrize(
    ("ref", "name", "tag", "registry"),
    [
        ("ubuntu", "ubuntu", "latest", "docker.io"),
        ("ubuntu:22.04", "ubuntu", "22.04", "docker.io"),
        ("nvcr.io/nvidia/pytorch:24.01-py3", "nvcr.io/nvidia/pytorch", "24.01-py3", "nvcr.io"),
        ("127.0.0.1:5000/x", "127.0.0.1:5000/x", "latest", "127.0.0.1:5000"),
        ("localhost/app:v1", "localhost/app", "v1", "localhost"),
        ("dstackai/base@sha256:abc", "dstackai/base", "sha256:abc", "docker.io"),
    ],
)
def test_image_references(ref: str, name: str, tag: str, registry: str) -> None:
    assert split_image(ref) == (name, tag)
    assert registry_of(name) == registry


def test_pull_failures_in_the_users_terms() -> None:
    ref = "127.0.0.1:5000/app:1"
    not_found = pull_failure_message(ref, "manifest for 127.0.0.1:5000/app:1 not found: manifest unknown")
    assert not_found.startswith("Image `127.0.0.1:5000/app:1` was not found in its registry (127.0.0.1:5000)")
    denied = pull_failure_message(ref, "unauthorized: authentication required")
    assert "refused to serve image" in denied and "registry_auth" in denied
    hub = pull_failure_message("private/app", "pull access denied for private/app, repository does not exist")
    assert "was not found" in hub and "(docker.io)" in hub
    down = pull_failure_message(ref, 'Get "http://127.0.0.1:5000/v2/": dial tcp 127.0.0.1:5000: connect: refused')
    assert "the registry 127.0.0.1:5000 is unreachable" in down
    dns = pull_failure_message("ubuntu", "lookup registry-1.docker.io: no such host")
    assert "the registry docker.io is unreachable" in dns
    assert pull_failure_message(ref, "disk full").startswith("Failed to pull image `127.0.0.1:5000/app:1`: disk full")


def test_pull_progress_sums_layers() -> None:
    t = PullTracker()
    assert not t.add({"status": "Pulling from library/x", "id": "1"})
    assert t.snapshot() == ImagePullProgress(0, 0, 0, False)
    for event in (
        {"status": "Already exists", "id": "base"},
        {"status": "Pulling fs layer", "id": "a"},
        {"status": "Pulling fs layer", "id": "b"},
        {"status": "Downloading", "id": "a", "progressDetail": {"current": 100, "total": 1000}},
    ):
        assert t.add(event)
    assert t.snapshot() == ImagePullProgress(100, 0, 1000, False)  # b's size is not known yet
    t.add({"status": "Downloading", "id": "b", "progressDetail": {"current": 50, "total": 500}})
    t.add({"status": "Download complete", "id": "a"})
    t.add({"status": "Extracting", "id": "a", "progressDetail": {"current": 400, "total": 1000}})
    assert t.snapshot() == ImagePullProgress(1050, 400, 1500, True)
    t.add({"status": "Pull complete", "id": "a"})
    t.add({"status": "Pull complete", "id": "b"})
    assert t.snapshot() == ImagePullProgress(1500, 1500, 1500, True)


def test_docker_helpers() -> None:
    assert parse_timestamp("2024-05-01T12:00:00.250000000Z") == 1714564800.25
    assert parse_timestamp("2024-05-01T12:00:00Z") == 1714564800.0
    header = registry_auth_header("u", "p", "reg:5000")
    assert "+" not in header and "/" not in header  # base64url
    assert Docker("unix:///x.sock").host == "unix:///x.sock"
    with pytest.raises(DockerUnavailable, match="unsupported Docker host 'ssh://host'"):
        Docker("ssh://host").version()


def test_container_wire_round_trips_and_old_messages() -> None:
    sub = _sub(
        entrypoint=["/bin/echo"],
        container=ContainerSpec(
            privileged=True,
            docker_in_docker=True,
            shm_size_mib=64,
            network_mode="bridge",
            ports=[80],
            volumes=[InstanceMount("/a", "/b", True)],
            gpus=2,
            cpus=1.5,
            memory_mib=1024,
            registry_username="u",
            registry_password="p",
        ).to_dict(),
    )
    assert JobSubmission.from_dict(sub.to_dict()) == sub
    redacted = sub.redacted()
    assert redacted.container is not None and redacted.container.registry_password is None
    assert redacted.container.registry_username == "u" and sub.container is not None
    assert sub.container.registry_password == "p"  # the original is untouched
    st = JobState(
        "j", "running", container=ContainerInfo("abc", "corral-j", "bridge", {80: 32768}, ["0"]),
        image_pull_progress=ImagePullProgress(1, 1, 2, True),
    )  # fmt: skip
    assert JobState.from_dict(st.to_dict()) == st
    # What an agent or server without containers sent/understood still parses.
    old = JobSubmission.from_dict({"job_id": "j", "run_name": "r", "commands": ["x"]})
    assert old.container is None and old.entrypoint is None
    assert _sub(container={"privileged": True}).container == ContainerSpec(privileged=True, docker_in_docker=False)
    assert JobState.from_dict({"job_id": "j", "state": "running"}).container is None


@pytest.mark.parametrize(
    ("container", "field"),
    [
        ({"network_mode": "overlay"}, "ContainerSpec.network_mode"),
        ({"ports": [0]}, "ContainerSpec.ports"),
        ({"ports": ["80"]}, "ContainerSpec.ports"),
        ({"gpus": -2}, "ContainerSpec.gpus"),
        ({"cpus": 0}, "ContainerSpec.cpus"),
        ({"memory_mib": 1}, "ContainerSpec.memory_mib"),
        ({"privileged": "yes"}, "ContainerSpec.privileged"),
        ({"docker_in_docker": 1}, "ContainerSpec.docker_in_docker"),
        ({"volumes": [{"instance_path": "rel", "path": "/x"}]}, "ContainerSpec.volumes[].instance_path"),
        ({"volumes": [{"instance_path": "/x"}]}, "ContainerSpec.volumes[].path"),
    ],
)
def test_container_spec_errors_name_the_field(container: dict[str, Any], field: str) -> None:
    with pytest.raises(ProtocolError, match=re.escape(field)):
        _sub(container=container)


def test_commands_may_be_empty_only_with_an_image() -> None:
    assert _sub(commands=[]).commands == []
    with pytest.raises(ProtocolError, match=r"JobSubmission\.commands"):
        JobSubmission.from_dict({"job_id": "j", "run_name": "r", "commands": []})
