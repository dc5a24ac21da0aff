"""What a placed job's submission to its agent carries, and what the server records from the agent's
first answer: the job's ``DSTACK_*`` environment, its provisioning data, the ports already held on this
machine that it would listen on, and the status message of a job run without a sandbox.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral.agent.protocol import JobState, JobSubmission
from corral.domain.records import InstanceRec, JobRec
from corral.schemas import wire
from corral.workers.job_ports import taken_ports


def job_gpus(job: JobRec, inst: InstanceRec) -> int:
    """The GPUs ``job`` has on ``inst``: all of them, or its share of an instance split into blocks."""
    resources = (inst.offer or {}).get("resources", {})
    gpus = len(resources.get("gpus") or [])
    total = inst.total_blocks or 1
    return gpus // total * job.blocks if total > 1 else gpus


def job_env(
    job: JobRec,
    run: Any,
    inst: InstanceRec,
    master_ip: str,
    nodes_ips: list[str],
    env: Mapping[str, Any] | None = None,
    nodes_gpus: list[int] | None = None,
) -> dict[str, str]:
    """The job's environment: its ``env`` (``env``: with its secrets filled in) and dstack's variables.
    ``nodes_gpus``: each node's GPUs (node groups may differ); ``DSTACK_GPUS_NUM`` is their sum."""
    spec = job.job_spec
    gpus_here = job_gpus(job, inst)
    nodes = int(spec.get("jobs_per_replica") or 1)
    env = dict(spec.get("env") or {}) if env is None else dict(env)
    env.update(
        {
            "DSTACK_RUN_NAME": job.run_name,
            "DSTACK_RUN_ID": job.run_id,
            "DSTACK_JOB_ID": job.id,
            "DSTACK_PROJECT": run.project_name,
            "DSTACK_NODE_RANK": str(job.job_num),
            "DSTACK_NODES_NUM": str(nodes),
            "DSTACK_MASTER_NODE_IP": master_ip,
            "DSTACK_NODES_IPS": "\n".join(nodes_ips),
            "DSTACK_GPUS_PER_NODE": str(gpus_here),
            "DSTACK_GPUS_NUM": str(sum(nodes_gpus) if nodes_gpus else gpus_here * nodes),
            "DSTACK_REPO_ID": str(run.run_spec.get("repo_id") or "none"),
        }
    )
    return env  # the agent adds DSTACK_REPO_DIR and DSTACK_WORKING_DIR (it knows where they are)


def sandbox_message(state: JobState) -> str | None:
    """The job's status message when its agent runs it without a sandbox (saying why)."""
    return state.sandbox.message if state.sandbox is not None else None


def provisioning_data(inst: InstanceRec, job_id: str, ssh: tuple[str, int] | None) -> dict[str, Any]:
    """dstack's ``job_provisioning_data``: the SSH fields in its ``dockerized`` layout, where ``hostname``
    and ``ssh_port`` are the server's SSH endpoint and ``username`` names the job (:mod:`corral.sshd`);
    ``internal_ip`` is the instance's own address."""
    return {
        "backend": "remote",
        "corral_backend": inst.backend,
        "corral_instance": inst.name,
        "instance_type": wire.instance_type(inst.offer),
        "instance_id": inst.id,
        "hostname": ssh[0] if ssh is not None else inst.hostname or "127.0.0.1",
        "internal_ip": inst.hostname or "127.0.0.1",
        "region": inst.region or "local",
        "price": inst.price or 0.0,
        "username": job_id,
        "ssh_port": ssh[1] if ssh is not None else None,
        "dockerized": True,
        "ssh_proxy": None,
        "backend_data": None,
    }


def ports_taken(conf: dict[str, Any], sub: JobSubmission, sandboxed: bool) -> list[int]:
    """The job's ``ports`` already held on this machine, when it would listen on them itself (a host
    process without a sandbox, or a container on the host's network; a sandboxed process listens in its own
    network namespace and a bridged container's ports are published elsewhere)."""
    if sub.image:
        if not (sub.container is not None and sub.container.network_mode == "host"):
            return []
    elif sandboxed:
        return []
    ports = [int(p["container_port"]) for p in conf.get("ports") or [] if isinstance(p, dict)]
    return taken_ports(ports) if ports else []  # a service's own `port` may be shared by its replicas
