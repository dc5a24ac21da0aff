"""What a job's end wakes besides its run's (scoped) runs pass: the volumes worker only where the job's instance
can have network volumes."""

from __future__ import annotations

import dataclasses
from typing import Any

from test_job_container import _job

from corral.workers.jobs.outcomes import after_end


def _on(provisioning: dict[str, Any] | None) -> tuple[str, ...]:
    return after_end(dataclasses.replace(_job(), job_provisioning_data=provisioning))


def test_a_job_on_a_local_or_ssh_host_does_not_wake_the_volumes_worker() -> None:
    assert _on({"backend": "remote", "corral_backend": "local"}) == ("scheduler",)
    assert _on({"backend": "remote", "corral_backend": "ssh"}) == ("scheduler",)


def test_a_job_on_a_cloud_instance_or_never_started_wakes_it_to_detach_what_it_had() -> None:
    assert "volumes" in _on({"backend": "remote", "corral_backend": "aws"})
    # its volumes are attached before the agent is asked to start it: a job that failed there has none recorded
    assert "volumes" in _on(None)


def test_a_job_on_slurm_wakes_the_instances_worker_to_end_its_allocation() -> None:
    assert _on({"backend": "slurm", "corral_backend": "slurm"}) == ("scheduler", "instances")
