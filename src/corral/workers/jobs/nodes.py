"""The nodes of a job's replica (a service's other replicas are not its nodes), and the ``DSTACK_*`` environment
they give each job: its rank, the master's address, every node's address and GPUs.

Pure. May import: corral.domain.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from corral.domain.records import InstanceRec, JobRec, RunRec
from corral.domain.statuses import READY_INSTANCE


@dataclasses.dataclass(frozen=True)
class Nodes:
    """The nodes of a job's replica (a service's other replicas are not its nodes), in rank order."""

    #: The job's own instance.
    inst: InstanceRec
    jobs: tuple[JobRec, ...]
    #: Each node's address: its host's, or on one host its sandbox's.
    ips: tuple[str, ...]
    #: Each node's GPUs (node groups may differ).
    gpus: tuple[int, ...]
    #: The nodes share one host (the local backend): they meet at their sandboxes' addresses; across hosts they
    #: keep the hosts' network, where they reach each other.
    one_host: bool = False
    #: Every node can be given its nodes' addresses (on one host, a node still starting has none yet).
    ready: bool = True

    @property
    def master_ip(self) -> str:
        return self.ips[0] if self.ips else "127.0.0.1"


def nodes_of(job: JobRec, inst: InstanceRec, run: RunRec, insts: list[InstanceRec]) -> Nodes:
    """The nodes of ``job``'s replica, from its run's jobs and their instances ``insts``."""
    ordered = sorted(
        (j for j in run.jobs if j.submission_num == job.submission_num and j.replica_num == job.replica_num),
        key=lambda j: j.job_num,
    )
    ips = {i.id: "127.0.0.1" if i.backend == "local" else (i.hostname or "") for i in insts}
    by_id = {i.id: i for i in insts}
    one_host = len(ordered) > 1 and all(i.backend == "local" for i in insts)
    ready = not one_host or all(
        (x := by_id.get(j.instance_id or "")) is not None and x.agent and x.status in READY_INSTANCE for j in ordered
    )
    return Nodes(
        inst=inst,
        jobs=tuple(ordered),
        ips=tuple(ips.get(j.instance_id or "", "") for j in ordered),
        gpus=tuple(job_gpus(j, by_id[j.instance_id]) if j.instance_id in by_id else 0 for j in ordered),
        one_host=one_host,
        ready=ready,
    )


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
