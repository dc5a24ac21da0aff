"""Statuses and termination reasons as dstack names them, and the explicit transition tables.

Every value here goes on the wire and is one the official dstack client knows; finer
distinctions belong in the ``*_message`` fields, never in new enum values.
"""

from __future__ import annotations

from enum import Enum


class RunStatus(str, Enum):
    PENDING = "pending"
    SUBMITTED = "submitted"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    FAILED = "failed"
    DONE = "done"

    def is_finished(self) -> bool:
        return self in _RUN_FINISHED


_RUN_FINISHED = frozenset({RunStatus.TERMINATED, RunStatus.FAILED, RunStatus.DONE})


class JobStatus(str, Enum):
    SUBMITTED = "submitted"
    PROVISIONING = "provisioning"
    PULLING = "pulling"
    RUNNING = "running"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    ABORTED = "aborted"
    FAILED = "failed"
    DONE = "done"

    def is_finished(self) -> bool:
        return self in _JOB_FINISHED


_JOB_FINISHED = frozenset({JobStatus.TERMINATED, JobStatus.ABORTED, JobStatus.FAILED, JobStatus.DONE})


class InstanceStatus(str, Enum):
    PENDING = "pending"
    PROVISIONING = "provisioning"
    IDLE = "idle"
    BUSY = "busy"
    TERMINATING = "terminating"
    TERMINATED = "terminated"

    def is_active(self) -> bool:
        return self not in (InstanceStatus.TERMINATING, InstanceStatus.TERMINATED)


class FleetStatus(str, Enum):
    SUBMITTED = "submitted"
    ACTIVE = "active"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    FAILED = "failed"


class RunTerminationReason(str, Enum):
    ALL_JOBS_DONE = "all_jobs_done"
    JOB_FAILED = "job_failed"
    RETRY_LIMIT_EXCEEDED = "retry_limit_exceeded"
    STOPPED_BY_USER = "stopped_by_user"
    ABORTED_BY_USER = "aborted_by_user"
    SERVER_ERROR = "server_error"
    GATEWAY_ERROR = "gateway_error"

    def to_status(self) -> RunStatus:
        return _RUN_REASON_STATUS[self]

    def to_job_reason(self) -> JobTerminationReason:
        return _RUN_TO_JOB_REASON[self]


class JobTerminationReason(str, Enum):
    FAILED_TO_START_DUE_TO_NO_CAPACITY = "failed_to_start_due_to_no_capacity"
    INTERRUPTED_BY_NO_CAPACITY = "interrupted_by_no_capacity"
    INSTANCE_UNREACHABLE = "instance_unreachable"
    INSTANCE_ACCESS_REVOKED = "instance_access_revoked"
    WAITING_INSTANCE_LIMIT_EXCEEDED = "waiting_instance_limit_exceeded"
    WAITING_RUNNER_LIMIT_EXCEEDED = "waiting_runner_limit_exceeded"
    TERMINATED_BY_USER = "terminated_by_user"
    VOLUME_ERROR = "volume_error"
    GATEWAY_ERROR = "gateway_error"
    SCALED_DOWN = "scaled_down"
    DONE_BY_RUNNER = "done_by_runner"
    ABORTED_BY_USER = "aborted_by_user"
    TERMINATED_BY_SERVER = "terminated_by_server"
    INACTIVITY_DURATION_EXCEEDED = "inactivity_duration_exceeded"
    TERMINATED_DUE_TO_UTILIZATION_POLICY = "terminated_due_to_utilization_policy"
    CONTAINER_EXITED_WITH_ERROR = "container_exited_with_error"
    PORTS_BINDING_FAILED = "ports_binding_failed"
    CREATING_CONTAINER_ERROR = "creating_container_error"
    EXECUTOR_ERROR = "executor_error"
    LOG_QUOTA_EXCEEDED = "log_quota_exceeded"
    MAX_DURATION_EXCEEDED = "max_duration_exceeded"

    def to_status(self) -> JobStatus:
        return _JOB_REASON_STATUS.get(self, JobStatus.FAILED)


class InstanceTerminationReason(str, Enum):
    TERMINATED_BY_USER = "terminated_by_user"
    IDLE_TIMEOUT = "idle_timeout"
    PROVISIONING_TIMEOUT = "provisioning_timeout"
    ERROR = "error"
    JOB_FINISHED = "job_finished"
    UNREACHABLE = "unreachable"
    NO_OFFERS = "no_offers"
    MASTER_FAILED = "master_failed"
    MAX_INSTANCES_LIMIT = "max_instances_limit"
    FLEET_SPEC_MISMATCH = "fleet_spec_mismatch"
    NO_BALANCE = "no_balance"


_RUN_REASON_STATUS = {
    RunTerminationReason.ALL_JOBS_DONE: RunStatus.DONE,
    RunTerminationReason.JOB_FAILED: RunStatus.FAILED,
    RunTerminationReason.RETRY_LIMIT_EXCEEDED: RunStatus.FAILED,
    RunTerminationReason.SERVER_ERROR: RunStatus.FAILED,
    RunTerminationReason.GATEWAY_ERROR: RunStatus.FAILED,
    RunTerminationReason.STOPPED_BY_USER: RunStatus.TERMINATED,
    RunTerminationReason.ABORTED_BY_USER: RunStatus.TERMINATED,
}

_RUN_TO_JOB_REASON = {
    RunTerminationReason.ALL_JOBS_DONE: JobTerminationReason.DONE_BY_RUNNER,
    RunTerminationReason.JOB_FAILED: JobTerminationReason.TERMINATED_BY_SERVER,
    RunTerminationReason.RETRY_LIMIT_EXCEEDED: JobTerminationReason.TERMINATED_BY_SERVER,
    RunTerminationReason.SERVER_ERROR: JobTerminationReason.TERMINATED_BY_SERVER,
    RunTerminationReason.GATEWAY_ERROR: JobTerminationReason.GATEWAY_ERROR,
    RunTerminationReason.STOPPED_BY_USER: JobTerminationReason.TERMINATED_BY_USER,
    RunTerminationReason.ABORTED_BY_USER: JobTerminationReason.ABORTED_BY_USER,
}

_JOB_REASON_STATUS = {
    JobTerminationReason.TERMINATED_BY_USER: JobStatus.TERMINATED,
    JobTerminationReason.SCALED_DOWN: JobStatus.TERMINATED,
    JobTerminationReason.DONE_BY_RUNNER: JobStatus.DONE,
    JobTerminationReason.ABORTED_BY_USER: JobStatus.ABORTED,
    JobTerminationReason.TERMINATED_BY_SERVER: JobStatus.TERMINATED,
    JobTerminationReason.INACTIVITY_DURATION_EXCEEDED: JobStatus.TERMINATED,
    JobTerminationReason.TERMINATED_DUE_TO_UTILIZATION_POLICY: JobStatus.TERMINATED,
    JobTerminationReason.MAX_DURATION_EXCEEDED: JobStatus.TERMINATED,
}


class IllegalTransition(ValueError):
    """A status change that the transition table does not allow."""


_S = JobStatus
JOB_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    _S.SUBMITTED: frozenset({_S.PROVISIONING, _S.TERMINATING}),
    _S.PROVISIONING: frozenset({_S.PULLING, _S.RUNNING, _S.TERMINATING}),
    _S.PULLING: frozenset({_S.RUNNING, _S.TERMINATING}),
    _S.RUNNING: frozenset({_S.TERMINATING}),
    _S.TERMINATING: frozenset({_S.TERMINATED, _S.ABORTED, _S.FAILED, _S.DONE}),
    _S.TERMINATED: frozenset(),
    _S.ABORTED: frozenset(),
    _S.FAILED: frozenset(),
    _S.DONE: frozenset(),
}

_R = RunStatus
RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    _R.PENDING: frozenset({_R.SUBMITTED, _R.TERMINATING}),
    _R.SUBMITTED: frozenset({_R.PROVISIONING, _R.RUNNING, _R.TERMINATING, _R.PENDING}),
    _R.PROVISIONING: frozenset({_R.RUNNING, _R.SUBMITTED, _R.TERMINATING, _R.PENDING}),
    _R.RUNNING: frozenset({_R.PROVISIONING, _R.SUBMITTED, _R.TERMINATING, _R.PENDING}),
    _R.TERMINATING: frozenset({_R.TERMINATED, _R.FAILED, _R.DONE, _R.PENDING}),
    _R.TERMINATED: frozenset(),
    _R.FAILED: frozenset(),
    _R.DONE: frozenset(),
}

_I = InstanceStatus
INSTANCE_TRANSITIONS: dict[InstanceStatus, frozenset[InstanceStatus]] = {
    _I.PENDING: frozenset({_I.PROVISIONING, _I.IDLE, _I.BUSY, _I.TERMINATING, _I.TERMINATED}),
    _I.PROVISIONING: frozenset({_I.IDLE, _I.BUSY, _I.TERMINATING, _I.TERMINATED}),
    _I.IDLE: frozenset({_I.BUSY, _I.TERMINATING}),
    _I.BUSY: frozenset({_I.IDLE, _I.TERMINATING}),
    _I.TERMINATING: frozenset({_I.TERMINATED}),
    _I.TERMINATED: frozenset(),
}

_F = FleetStatus
FLEET_TRANSITIONS: dict[FleetStatus, frozenset[FleetStatus]] = {
    _F.SUBMITTED: frozenset({_F.ACTIVE, _F.FAILED, _F.TERMINATING}),
    _F.ACTIVE: frozenset({_F.TERMINATING, _F.FAILED}),
    _F.TERMINATING: frozenset({_F.TERMINATED, _F.ACTIVE}),
    _F.TERMINATED: frozenset(),
    _F.FAILED: frozenset({_F.TERMINATING, _F.TERMINATED}),
}


def check_job_transition(old: JobStatus, new: JobStatus) -> None:
    if old != new and new not in JOB_TRANSITIONS[old]:
        raise IllegalTransition(f"job cannot go from {old.value} to {new.value}")


def check_run_transition(old: RunStatus, new: RunStatus) -> None:
    if old != new and new not in RUN_TRANSITIONS[old]:
        raise IllegalTransition(f"run cannot go from {old.value} to {new.value}")


def check_instance_transition(old: InstanceStatus, new: InstanceStatus) -> None:
    if old != new and new not in INSTANCE_TRANSITIONS[old]:
        raise IllegalTransition(f"instance cannot go from {old.value} to {new.value}")


def check_fleet_transition(old: FleetStatus, new: FleetStatus) -> None:
    if old != new and new not in FLEET_TRANSITIONS[old]:
        raise IllegalTransition(f"fleet cannot go from {old.value} to {new.value}")


def run_status_from_jobs(jobs: list[JobStatus]) -> RunStatus | None:
    """The active run status implied by its jobs (None when all jobs are finished)."""
    if any(j == JobStatus.RUNNING for j in jobs):
        return RunStatus.RUNNING
    if any(j in (JobStatus.PROVISIONING, JobStatus.PULLING) for j in jobs):
        return RunStatus.PROVISIONING
    if any(j == JobStatus.SUBMITTED for j in jobs):
        return RunStatus.SUBMITTED
    if any(j == JobStatus.TERMINATING for j in jobs):
        return RunStatus.RUNNING
    return None
