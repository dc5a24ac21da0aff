"""``startup_order`` as dstack 0.22.5's ``_should_wait_for_other_nodes`` applies it: which node waits for which."""

from __future__ import annotations

from typing import Any

from corral.domain.records import JobRec, RunRec
from corral.domain.startup_order import job_waits_for, startup_order, waits_for
from corral.domain.statuses import JobStatus, RunStatus


def _job(job_num: int, status: JobStatus, submission: int = 0, replica: int = 0) -> JobRec:
    return JobRec(
        id=f"j{replica}-{job_num}-{submission}", run_id="r", project_id="p", run_name="run", job_num=job_num,
        replica_num=replica, job_name=f"run-{replica}-{job_num}", submission_num=submission, deployment_num=0,
        submitted_at=0.0, last_processed_at=0.0, finished_at=None, status=status, status_message=None,
        termination_reason=None, termination_reason_message=None, exit_status=None, job_spec={}, priority=0,
        instance_id="i", job_provisioning_data=None, job_runtime_data=None, stop_requested=None,
        disconnected_at=None, log_offset=0, wait_deadline=None,
    )  # fmt: skip


def _run(spec: dict[str, Any], jobs: tuple[JobRec, ...]) -> RunRec:
    return RunRec(
        id="r", project_id="p", project_name="main", user_name="admin", run_name="run", submitted_at=0.0,
        last_processed_at=0.0, status=RunStatus.RUNNING, status_message=None, termination_reason=None,
        run_spec=spec, priority=0, fleet_id=None, fleet_name=None, deployment_num=0, deleted=False, jobs=jobs,
    )  # fmt: skip


def test_the_order_is_the_configurations_else_the_profiles_else_any() -> None:
    assert startup_order(None) == "any"
    assert startup_order({"configuration": {"type": "task"}, "profile": None}) == "any"
    assert startup_order({"configuration": {}, "profile": {"startup_order": "workers-first"}}) == "workers-first"
    both = {"configuration": {"startup_order": "master-first"}, "profile": {"startup_order": "workers-first"}}
    assert startup_order(both) == "master-first"


def test_master_first_holds_the_workers_until_the_master_runs() -> None:
    assert waits_for("master-first", 1, {0: "provisioning"}) is not None
    assert waits_for("master-first", 1, {0: "running", 2: "provisioning"}) is None
    assert waits_for("master-first", 0, {1: "provisioning"}) is None


def test_workers_first_holds_the_master_until_every_worker_runs() -> None:
    assert waits_for("workers-first", 0, {1: "running", 2: "pulling"}) is not None
    assert waits_for("workers-first", 0, {1: "running", 2: "running"}) is None
    assert waits_for("workers-first", 1, {0: "provisioning"}) is None


def test_any_waits_for_nothing() -> None:
    assert waits_for("any", 1, {0: "provisioning"}) is None
    assert waits_for("any", 0, {1: "provisioning"}) is None


def test_a_job_sees_the_latest_submission_of_each_other_node_of_its_replica() -> None:
    spec = {"configuration": {"type": "task", "nodes": 2, "startup_order": "master-first"}}
    old_master, master = _job(0, JobStatus.TERMINATED, 0), _job(0, JobStatus.RUNNING, 1)
    worker = _job(1, JobStatus.PROVISIONING, 1)
    other_replica = _job(0, JobStatus.PROVISIONING, 1, replica=1)
    assert job_waits_for(worker, _run(spec, (master, old_master, worker, other_replica))) is None
    assert job_waits_for(worker, _run(spec, (old_master, worker))) is not None
    assert job_waits_for(master, _run(spec, (master, worker))) is None
