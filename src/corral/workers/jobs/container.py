"""The container side of a job submission, and what the job's ``JobRuntimeData`` says about it.

A job runs in a container when its configuration sets ``image``, or when the server has a default
image (``CORRAL_DEFAULT_IMAGE``); otherwise it runs as a host process, as before. For a container
this module decides what dstack decides for the shim: the user, ``entrypoint + commands``, the shell
(``/bin/bash`` with the default image, as dstack does with its own), privileged mode, the shm size,
instance volumes, the registry credentials, and from the job's blocks of the instance the network
(host for the whole instance, a bridge with published ports for a share), the GPUs (all of them, or
the share's count) and the CPU and memory limits (a share only).

``image_pull_progress`` has no column of its own: it rides in the job's runtime data and the API
serializer moves it to dstack's ``JobSubmission.image_pull_progress``.

Pure. May import: corral.domain, corral.scheduler (blocks, codec) and the agent's protocol.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from corral.agent.protocol import JobState, JobSubmission
from corral.agent.protocol_containers import ContainerSpec, InstanceMount
from corral.domain.records import InstanceRec, JobRec
from corral.domain.resources import InstanceResources
from corral.scheduler.blocks import share
from corral.scheduler.codec import resources_from_json

PULL_PROGRESS_KEY = "image_pull_progress"


def job_share(job: JobRec, inst: InstanceRec) -> tuple[InstanceResources | None, bool]:
    """The resources of the job's blocks of the instance, and whether that is the whole host (all of an
    instance that is not itself carved out of a larger host, as local instances are of this machine)."""
    total = inst.total_blocks or 1
    offer = inst.offer or {}
    carved = int(offer.get("host_blocks") or 0) < int(offer.get("host_total_blocks") or 0)
    whole = job.blocks >= total
    resources = offer.get("resources")
    if not resources:
        return None, whole and not carved
    res = resources_from_json(resources)
    return (res if whole else share(res, job.blocks, total)), whole and not carved


def apply_container(
    sub: JobSubmission,
    job: JobRec,
    conf: dict[str, Any],
    inst: InstanceRec,
    default_image: str | None,
    nodes: int = 1,
) -> None:
    """Fill in the submission's entrypoint, image, user, shell and container options (``user`` names a
    user of the image, or for a host process the user it is inside its sandbox)."""
    if conf.get("entrypoint"):
        sub.entrypoint = shlex.split(str(conf["entrypoint"]))
    docker = conf.get("docker") is True
    # dstack: `docker: true` runs in its docker-in-docker image, named in the job spec when it was made
    sub.image = str(job.job_spec.get("image_name") or "") if docker else conf.get("image") or default_image
    if sub.image and not conf.get("image") and conf.get("nvcc") and "-base-" in sub.image:
        sub.image = sub.image.replace("-base-", "-devel-")  # dstack: `nvcc` picks its image's devel variant
    sub.user = conf.get("user")  # a host process: the user it is inside its sandbox
    if not sub.image:
        sub.ports = _ports(conf)  # a sandboxed host process: reached through the agent's relays
        sub.volumes = instance_mounts(conf)
        return
    if not conf.get("image") and sub.shell is None:
        sub.shell = "bash"  # dstack: /bin/bash in its default image, /bin/sh in the user's own
    res, whole = job_share(job, inst)
    nvidia = [g for g in (res.gpus if res else ()) if g.vendor == "nvidia"]
    auth = conf.get("registry_auth") or {}
    shm = (conf.get("resources") or {}).get("shm_size")
    sub.container = ContainerSpec(
        privileged=bool(conf.get("privileged")) or docker,
        docker_in_docker=docker,
        shm_size_mib=int(float(shm) * 1024) if shm else None,
        # the host's network only where it is needed: a whole host of an SSH fleet, or the nodes of a
        # multi-node run (they meet at the hosts' addresses); on the local backend a job's ports would
        # collide with the CLI's local forwards of the same numbers, so it gets a bridge and published ports
        network_mode="host" if whole and (inst.backend != "local" or nodes > 1) else "bridge",
        ports=_ports(conf),
        volumes=instance_mounts(conf),
        gpus=(-1 if whole else len(nvidia)) if nvidia else 0,
        cpus=float(res.cpus) if res and not whole and res.cpus > 0 else None,
        memory_mib=res.memory_mib if res and not whole and res.memory_mib >= 4 else None,
        registry_username=auth.get("username"),
        registry_password=auth.get("password"),
    )


def instance_mounts(conf: Mapping[str, Any]) -> list[InstanceMount]:
    """The run's instance volumes (``/host/path:/path``): bound into its container, or into its sandbox."""
    return [
        InstanceMount(str(v["instance_path"]), str(v["path"]), bool(v.get("optional")))
        for v in conf.get("volumes") or []
        if isinstance(v, dict) and v.get("instance_path")
    ]


def _ports(conf: dict[str, Any]) -> list[int]:
    """The ports the job listens on: its ``ports``, and a service's ``port`` (where its proxy reaches it)."""
    ports = [int(p["container_port"]) for p in conf.get("ports") or [] if isinstance(p, dict)]
    service = conf.get("port") if conf.get("type") == "service" else None
    if isinstance(service, dict) and int(service["container_port"]) not in ports:
        ports.append(int(service["container_port"]))
    return ports


#: dstack's ``DSTACK_RUNNER_SSH_PORT``: the ``<run>`` hop's port behind the ``<run>-host`` hop.
CONTAINER_SSH_PORT = 10022


def runtime_data(sub: JobSubmission, working_dir: str | None) -> dict[str, Any]:
    """dstack's ``JobRuntimeData`` of a job just handed to its agent."""
    spec = sub.container
    data: dict[str, Any] = {
        "network_mode": spec.network_mode if spec else "host",
        "working_dir": working_dir,
        "username": None,
        "ports": None,
        "offer": None,
    }
    if spec is not None and spec.memory_mib is not None:  # a share of the instance: dstack records it
        data.update(cpu=spec.cpus, gpu=max(spec.gpus, 0), memory=round(spec.memory_mib / 1024, 3))
    if sub.network_volumes:  # dstack's ``volume_names``: the alternative of each mount point it mounts
        data["volume_names"] = [m.name for m in sub.network_volumes]
    return data


def with_agent_state(data: dict[str, Any] | None, state: JobState) -> dict[str, Any]:
    """The runtime data updated from what the agent reports: the container's network and ports once
    it runs, a sandboxed host process's ports (its relays on the agent's host), the image pull progress
    while it is pulled."""
    out = dict(data or {"network_mode": "host", "ports": None})
    info = state.container
    if info is not None and state.state != "pending":
        out["network_mode"] = info.network_mode
        ports = {} if info.network_mode == "host" else {str(c): h for c, h in info.ports.items()}
        # An exited container publishes nothing any more: keep the ports it had while it ran.
        if ports or state.state == "running" or not out.get("ports"):
            out["ports"] = ports
    sandbox = state.sandbox
    if sandbox is not None and sandbox.address is not None:
        out["network_mode"], out["ports"] = "bridge", {str(c): h for c, h in sandbox.ports.items()}
    if state.state == "pending" and state.image_pull_progress is not None:
        out[PULL_PROGRESS_KEY] = state.image_pull_progress.to_dict()
    else:
        out.pop(PULL_PROGRESS_KEY, None)
    # the job's own SSH server is at CONTAINER_SSH_PORT behind the endpoint's outer hop (corral.sshd), the
    # port the official CLI assumes when ``ports`` does not name it
    out["username"] = out.get("username") or "root"
    if state.working_dir:
        out["working_dir"] = state.working_dir
    return out
