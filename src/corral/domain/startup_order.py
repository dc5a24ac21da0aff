"""``startup_order`` of a multi-node task, as dstack 0.22.5 applies it before it starts a job on its instance
(``_should_wait_for_other_nodes``): ``master-first`` starts the other nodes once the master (job 0) runs,
``workers-first`` starts the master once every other node runs; ``any`` starts them as they are placed. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral.domain.documents import spec_configuration
from corral.domain.records import JobRec, RunRec

RUNNING = "running"


def startup_order(run_spec: Mapping[str, Any] | None) -> str:
    """The run's ``startup_order``: its configuration's, else its profile's (dstack's merged profile), else
    ``any``."""
    conf = spec_configuration(run_spec)
    profile = (run_spec or {}).get("profile")
    given = conf.get("startup_order")
    if given is None and isinstance(profile, Mapping):
        given = profile.get("startup_order")
    return str(given) if given is not None else "any"


def waits_for(order: str, job_num: int, others: Mapping[int, str]) -> str | None:
    """What the job ``job_num`` waits for before it starts (None: nothing), given the status of each other job
    of its replica (by job number: its latest submission's)."""
    if order == "master-first" and job_num != 0 and others.get(0) != RUNNING:
        return "the master job to run (startup_order: master-first)"
    if order == "workers-first" and job_num == 0 and any(s != RUNNING for s in others.values()):
        return "the worker jobs to run (startup_order: workers-first)"
    return None


def job_waits_for(job: JobRec, run: RunRec) -> str | None:
    """:func:`waits_for` for ``job`` of ``run``: the other jobs of its replica, each by its latest submission."""
    latest: dict[int, JobRec] = {}
    for j in run.jobs:
        if j.replica_num == job.replica_num and j.job_num != job.job_num:
            seen = latest.get(j.job_num)
            if seen is None or j.submission_num > seen.submission_num:
                latest[j.job_num] = j
    others = {n: str(j.status) for n, j in latest.items()}
    return waits_for(startup_order(run.run_spec), job.job_num, others)
