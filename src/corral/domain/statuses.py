"""Statuses and termination reasons as dstack names them, and the explicit transition tables.

Every value here goes on the wire and is one the official dstack client knows; finer
distinctions belong in the ``*_message`` fields, never in new enum values.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any


class _Status(str, Enum):
    """A status: compares, hashes and prints as its value (``"running"``), so it goes where a plain string does."""

    def __str__(self) -> str:
        return str(self.value)


class RunStatus(_Status):
    PENDING = "pending"
    SUBMITTED = "submitted"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    FAILED = "failed"
    DONE = "done"

    def is_finished(self) -> bool:
        return self in FINISHED_RUN


class JobStatus(_Status):
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
        return self in FINISHED_JOB


class InstanceStatus(_Status):
    PENDING = "pending"
    PROVISIONING = "provisioning"
    IDLE = "idle"
    BUSY = "busy"
    TERMINATING = "terminating"
    TERMINATED = "terminated"

    def is_active(self) -> bool:
        return self not in ENDING_INSTANCE


class FleetStatus(_Status):
    SUBMITTED = "submitted"
    ACTIVE = "active"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    FAILED = "failed"


class GatewayStatus(_Status):
    """dstack 0.22.5's ``GatewayStatus`` (``core/models/gateways.py``)."""

    SUBMITTED = "submitted"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    FAILED = "failed"


#: Each status by its value: what a stored value reads as (a dict lookup: a twentieth of calling the enum).
JOB_STATUS: Mapping[str, JobStatus] = {s.value: s for s in JobStatus}
RUN_STATUS: Mapping[str, RunStatus] = {s.value: s for s in RunStatus}
INSTANCE_STATUS: Mapping[str, InstanceStatus] = {s.value: s for s in InstanceStatus}
FLEET_STATUS: Mapping[str, FleetStatus] = {s.value: s for s in FleetStatus}
GATEWAY_STATUS: Mapping[str, GatewayStatus] = {s.value: s for s in GatewayStatus}


# --- named sets of statuses: tuples (ordered, for SQL ``IN`` as for ``in``) of values that equal their strings -----

#: A job that has ended for good.
FINISHED_JOB = (JobStatus.TERMINATED, JobStatus.ABORTED, JobStatus.FAILED, JobStatus.DONE)
#: A job placed on an instance and not asked to stop: starting or running.
ACTIVE_JOB = (JobStatus.PROVISIONING, JobStatus.PULLING, JobStatus.RUNNING)
#: A job that holds its instance's capacity: active, or stopping.
HOLDING_JOB = (*ACTIVE_JOB, JobStatus.TERMINATING)
#: A job that has not ended: waiting in the queue, or holding capacity.
UNFINISHED_JOB = (JobStatus.SUBMITTED, *HOLDING_JOB)
#: A job a stop still has to ask: waiting or active (neither stopping already nor ended).
STOPPABLE_JOB = (JobStatus.SUBMITTED, *ACTIVE_JOB)

#: A run that has ended for good.
FINISHED_RUN = (RunStatus.TERMINATED, RunStatus.FAILED, RunStatus.DONE)
#: A run that is gone or going: stopping, or ended.
ENDING_RUN = (RunStatus.TERMINATING, *FINISHED_RUN)
#: A run whose jobs are wanted now: neither waiting for its next trigger (``pending``) nor stopping nor ended.
ACTIVE_RUN = (RunStatus.SUBMITTED, RunStatus.PROVISIONING, RunStatus.RUNNING)

#: An instance whose agent answers: it can take jobs.
READY_INSTANCE = (InstanceStatus.IDLE, InstanceStatus.BUSY)
#: An instance on its way up, or up: one a job may be placed on.
USABLE_INSTANCE = (InstanceStatus.PENDING, InstanceStatus.PROVISIONING, *READY_INSTANCE)
#: An instance that is gone or going.
ENDING_INSTANCE = (InstanceStatus.TERMINATING, InstanceStatus.TERMINATED)
#: An instance that is not gone yet (a terminating one still counts: its capacity is still the cloud's bill).
UNFINISHED_INSTANCE = (*USABLE_INSTANCE, InstanceStatus.TERMINATING)

#: A fleet that is gone or going.
ENDING_FLEET = (FleetStatus.TERMINATING, FleetStatus.TERMINATED)


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
_JOB_ENDS = frozenset({_S.TERMINATED, _S.ABORTED, _S.FAILED, _S.DONE})
JOB_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    # A waiting job is on no instance, so it ends at once: failed when no capacity will come (or its instance
    # could not be provisioned), terminated or aborted when its run is stopped or scaled down -- there is nothing
    # to stop, so it does not pass through ``terminating``.
    _S.SUBMITTED: frozenset({_S.PROVISIONING, _S.TERMINATING, _S.TERMINATED, _S.ABORTED, _S.FAILED}),
    # A placed job ends as its agent reports it (it exited, was stopped by its agent, or could not start), in
    # whatever status the server last saw it: ``terminating`` is only the server's own stop, waiting for the agent.
    _S.PROVISIONING: frozenset({_S.PULLING, _S.RUNNING, _S.TERMINATING}) | _JOB_ENDS,
    _S.PULLING: frozenset({_S.RUNNING, _S.TERMINATING}) | _JOB_ENDS,
    _S.RUNNING: frozenset({_S.TERMINATING}) | _JOB_ENDS,
    _S.TERMINATING: _JOB_ENDS,
    _S.TERMINATED: frozenset(),
    _S.ABORTED: frozenset(),
    _S.FAILED: frozenset(),
    _S.DONE: frozenset(),
}

_R = RunStatus
_RUN_ENDS = frozenset({_R.TERMINATED, _R.FAILED, _R.DONE})
RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    # ``pending``: a scheduled run between triggers; it goes back to it when a trigger's jobs have ended.
    _R.PENDING: frozenset({_R.SUBMITTED, _R.TERMINATING}),
    # A run whose jobs have all ended ends in the same step (nothing is left to stop); ``terminating`` is a stop
    # (by its user, or a failed job's: the others are stopped first).
    _R.SUBMITTED: frozenset({_R.PROVISIONING, _R.RUNNING, _R.TERMINATING, _R.PENDING}) | _RUN_ENDS,
    _R.PROVISIONING: frozenset({_R.RUNNING, _R.SUBMITTED, _R.TERMINATING, _R.PENDING}) | _RUN_ENDS,
    _R.RUNNING: frozenset({_R.PROVISIONING, _R.SUBMITTED, _R.TERMINATING, _R.PENDING}) | _RUN_ENDS,
    _R.TERMINATING: frozenset({_R.PENDING}) | _RUN_ENDS,
    _R.TERMINATED: frozenset(),
    _R.FAILED: frozenset(),
    _R.DONE: frozenset(),
}

_I = InstanceStatus
INSTANCE_TRANSITIONS: dict[InstanceStatus, frozenset[InstanceStatus]] = {
    _I.PENDING: frozenset({_I.PROVISIONING, _I.IDLE, _I.BUSY, _I.TERMINATING, _I.TERMINATED}),
    _I.PROVISIONING: frozenset({_I.IDLE, _I.BUSY, _I.TERMINATING, _I.TERMINATED}),
    # An instance its cloud took away (a spot interruption: ``workers/interruptions.py``) is gone already: there
    # is nothing to terminate, so it does not pass through ``terminating``.
    _I.IDLE: frozenset({_I.BUSY, _I.TERMINATING, _I.TERMINATED}),
    _I.BUSY: frozenset({_I.IDLE, _I.TERMINATING, _I.TERMINATED}),
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

_G = GatewayStatus
GATEWAY_TRANSITIONS: dict[GatewayStatus, frozenset[GatewayStatus]] = {
    # A gateway is held on its host from the start: one whose host cannot be found fails at once.
    _G.SUBMITTED: frozenset({_G.PROVISIONING, _G.RUNNING, _G.FAILED}),
    _G.PROVISIONING: frozenset({_G.RUNNING, _G.FAILED}),
    # A running gateway whose process must be deployed again (its host restarted) provisions again.
    _G.RUNNING: frozenset({_G.PROVISIONING, _G.FAILED}),
    # A failed gateway is deleted and applied again (dstack: "Delete it and re-apply").
    _G.FAILED: frozenset(),
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


def check_gateway_transition(old: GatewayStatus, new: GatewayStatus) -> None:
    if old != new and new not in GATEWAY_TRANSITIONS[old]:
        raise IllegalTransition(f"gateway cannot go from {old.value} to {new.value}")


#: Per kind of entity: the statuses its rows are inserted with (a run: ``pending`` when scheduled, ``running`` for a
#: service at zero replicas; a fleet is inserted ``active``: ``submitted`` is dstack's, never written).
INITIAL: dict[str, tuple[Enum, ...]] = {
    "job": (JobStatus.SUBMITTED,),
    "run": (RunStatus.SUBMITTED, RunStatus.PENDING, RunStatus.RUNNING),
    "instance": (InstanceStatus.PENDING,),
    "fleet": (FleetStatus.ACTIVE,),
    "gateway": (GatewayStatus.SUBMITTED,),
}

#: Per kind of entity (as events name them): its status enum and transition table.
TRANSITIONS: dict[str, tuple[type[Enum], Mapping[Any, frozenset[Any]]]] = {
    "job": (JobStatus, JOB_TRANSITIONS),
    "run": (RunStatus, RUN_TRANSITIONS),
    "instance": (InstanceStatus, INSTANCE_TRANSITIONS),
    "fleet": (FleetStatus, FLEET_TRANSITIONS),
    "gateway": (GatewayStatus, GATEWAY_TRANSITIONS),
}


def is_legal_transition(kind: str, old: str, new: str) -> bool:
    """Whether an entity of ``kind`` (``job``, ``run``, ``instance``, ``fleet``, ``gateway``) may go from status
    ``old`` to ``new`` (staying in one is always allowed); a value outside the status enum never is."""
    if old == new:
        return True
    enum, table = TRANSITIONS[kind]
    try:
        return enum(new) in table[enum(old)]
    except ValueError:
        return False


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
