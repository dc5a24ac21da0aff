"""Statuses as dstack names them: strings on the wire, the named sets, termination reasons and the
transition tables every status change is checked against."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.domain.statuses import (
    FINISHED_JOB,
    FINISHED_RUN,
    INITIAL,
    TRANSITIONS,
    FleetStatus,
    IllegalTransition,
    InstanceStatus,
    JobStatus,
    JobTerminationReason,
    RunStatus,
    RunTerminationReason,
    check_fleet_transition,
    check_gateway_transition,
    check_instance_transition,
    check_job_transition,
    check_run_transition,
    is_legal_transition,
    run_status_from_jobs,
)

CHECKS: dict[str, Callable[[object, object], None]] = {
    "job": check_job_transition,  # type: ignore[dict-item]
    "run": check_run_transition,  # type: ignore[dict-item]
    "instance": check_instance_transition,  # type: ignore[dict-item]
    "fleet": check_fleet_transition,  # type: ignore[dict-item]
    "gateway": check_gateway_transition,  # type: ignore[dict-item]
}


def test_a_status_prints_and_compares_as_its_wire_value() -> None:
    assert str(JobStatus.RUNNING) == "running"
    assert f"{RunStatus.DONE}" == "done"
    idle: str = InstanceStatus.IDLE  # (a str, as the store and the wire compare it)
    assert idle == "idle" and {"busy": 1}[InstanceStatus.BUSY] == 1


def test_finished_and_active_are_the_named_sets() -> None:
    assert [s for s in RunStatus if s.is_finished()] == list(FINISHED_RUN)
    assert [s for s in JobStatus if s.is_finished()] == list(FINISHED_JOB)
    assert [s for s in InstanceStatus if s.is_active()] == ["pending", "provisioning", "idle", "busy"]


def test_run_termination_reasons_map_to_a_final_status_and_their_jobs_reason() -> None:
    assert RunTerminationReason.ALL_JOBS_DONE.to_status() is RunStatus.DONE
    assert RunTerminationReason.STOPPED_BY_USER.to_status() is RunStatus.TERMINATED
    assert RunTerminationReason.JOB_FAILED.to_status() is RunStatus.FAILED
    assert RunTerminationReason.ABORTED_BY_USER.to_job_reason() is JobTerminationReason.ABORTED_BY_USER
    assert RunTerminationReason.GATEWAY_ERROR.to_job_reason() is JobTerminationReason.GATEWAY_ERROR
    for reason in RunTerminationReason:  # every reason has both
        assert reason.to_status().is_finished()
        assert reason.to_job_reason().to_status().is_finished()


def test_a_job_reason_not_named_a_stop_or_a_success_is_a_failure() -> None:
    assert JobTerminationReason.DONE_BY_RUNNER.to_status() is JobStatus.DONE
    assert JobTerminationReason.SCALED_DOWN.to_status() is JobStatus.TERMINATED
    assert JobTerminationReason.CONTAINER_EXITED_WITH_ERROR.to_status() is JobStatus.FAILED


@pytest.mark.parametrize("kind", list(TRANSITIONS))
def test_the_check_raises_exactly_where_the_table_refuses(kind: str) -> None:
    enum, table = TRANSITIONS[kind]
    for old in enum:
        for new in enum:
            legal = old == new or new in table[old]
            assert is_legal_transition(kind, old.value, new.value) is legal
            if legal:
                CHECKS[kind](old, new)
            else:
                with pytest.raises(IllegalTransition, match=f"^{kind} cannot go from {old.value} to {new.value}$"):
                    CHECKS[kind](old, new)


def test_some_transitions_users_rely_on() -> None:
    check_job_transition(JobStatus.SUBMITTED, JobStatus.ABORTED)  # a waiting job ends at once
    check_instance_transition(InstanceStatus.IDLE, InstanceStatus.TERMINATED)  # a spot interruption
    check_run_transition(RunStatus.TERMINATING, RunStatus.PENDING)  # a scheduled run between triggers
    check_fleet_transition(FleetStatus.TERMINATING, FleetStatus.ACTIVE)
    with pytest.raises(IllegalTransition):
        check_job_transition(JobStatus.DONE, JobStatus.RUNNING)
    with pytest.raises(IllegalTransition):
        check_instance_transition(InstanceStatus.TERMINATING, InstanceStatus.IDLE)


def test_every_status_is_reachable_from_an_initial_one() -> None:
    for kind, (enum, table) in TRANSITIONS.items():
        seen: set[Enum] = set(INITIAL[kind])
        todo = list(seen)
        while todo:
            for nxt in table[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        unreachable = {s for s in enum} - seen
        assert unreachable <= {FleetStatus.SUBMITTED}, kind  # dstack's, never written


@given(st.text(max_size=12), st.text(max_size=12))
def test_a_value_outside_the_enum_is_never_a_legal_change_but_staying_is(old: str, new: str) -> None:
    valid = {s.value for s in JobStatus}
    if old == new:
        assert is_legal_transition("job", old, new)
    elif old not in valid or new not in valid:
        assert not is_legal_transition("job", old, new)


def test_a_run_is_as_far_along_as_its_furthest_job() -> None:
    J = JobStatus
    assert run_status_from_jobs([J.SUBMITTED, J.RUNNING, J.TERMINATING]) is RunStatus.RUNNING
    assert run_status_from_jobs([J.SUBMITTED, J.PULLING]) is RunStatus.PROVISIONING
    assert run_status_from_jobs([J.SUBMITTED, J.PROVISIONING, J.DONE]) is RunStatus.PROVISIONING
    assert run_status_from_jobs([J.SUBMITTED, J.FAILED]) is RunStatus.SUBMITTED
    assert run_status_from_jobs([J.TERMINATING, J.DONE]) is RunStatus.RUNNING  # still stopping
    assert run_status_from_jobs([J.DONE, J.FAILED]) is None
    assert run_status_from_jobs([]) is None


def test_a_stored_value_outside_the_enum_is_never_a_legal_change() -> None:
    assert not is_legal_transition("job", "running", "paused")
    assert not is_legal_transition("fleet", "sleeping", "active")
    assert is_legal_transition("run", "paused", "paused")  # staying is always allowed
