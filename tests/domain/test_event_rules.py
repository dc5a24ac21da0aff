"""Event targets and messages as dstack records them."""

from __future__ import annotations

import pytest

from corral.domain.events import (
    Target,
    clean_message,
    fleet_target,
    instance_target,
    job_target,
    project_target,
    run_target,
    secret_target,
    status_change_message,
    user_target,
)


def test_each_target_links_the_parent_its_within_filter_finds() -> None:
    assert project_target("p1", "main") == Target("project", "p1", "p1", "main")
    assert user_target("u1", "ann") == Target("user", None, "u1", "ann")
    assert fleet_target("p1", "f1", "gpu").fleet_id == "f1"
    inst = instance_target("p1", "i1", "gpu-0", "f1")
    assert (inst.type, inst.fleet_id, inst.run_id) == ("instance", "f1", None)
    assert run_target("p1", "r1", "train").run_id == "r1"
    job = job_target("p1", "j1", "train-0-0", "r1")
    assert (job.type, job.run_id, job.fleet_id) == ("job", "r1", None)
    assert secret_target("p1", "s1", "token") == Target("secret", "p1", "s1", "token")


def test_a_target_type_must_be_one_of_dstacks() -> None:
    with pytest.raises(ValueError, match="unknown event target type 'team'"):
        Target("team", "p1", "t1", "x")


def test_users_have_no_project_and_everything_else_has_one() -> None:
    with pytest.raises(ValueError, match="a user target cannot have a project"):
        Target("user", "p1", "u1", "ann")
    with pytest.raises(ValueError, match="a run target must have a project"):
        Target("run", None, "r1", "train")


def test_messages_are_stored_on_one_line_without_a_final_period() -> None:
    assert clean_message("  Fleet created.\n") == "Fleet created"
    assert clean_message("Line one\nline two...") == "Line one line two"
    with pytest.raises(ValueError, match="an event needs a message"):
        clean_message(" . ")


def test_a_status_change_names_both_statuses_in_capitals() -> None:
    assert status_change_message("run", "submitted", "running") == "Run status changed SUBMITTED -> RUNNING"
    # a reason is told only where the change says an end
    assert status_change_message("job", "pulling", "running", "STOPPED_BY_USER") == (
        "Job status changed PULLING -> RUNNING"
    )


def test_a_run_tells_its_termination_reason_but_not_the_reason_message() -> None:
    msg = status_change_message("run", "running", "terminating", "stopped_by_user", "asked by ann")
    assert msg == "Run status changed RUNNING -> TERMINATING. Termination reason: STOPPED_BY_USER"


def test_a_job_ending_without_terminating_tells_its_reason_and_message() -> None:
    msg = status_change_message("job", "running", "failed", "container_exited_with_error", "exit 1")
    assert msg == "Job status changed RUNNING -> FAILED. Termination reason: CONTAINER_EXITED_WITH_ERROR (exit 1)"
    # reached through terminating: the reason was told then
    assert status_change_message("job", "terminating", "failed", "x") == "Job status changed TERMINATING -> FAILED"
    # an end without a reason
    assert status_change_message("instance", "busy", "terminated") == "Instance status changed BUSY -> TERMINATED"


def test_a_fleet_tells_its_status_message_instead_of_a_reason() -> None:
    assert status_change_message("fleet", "active", "terminating", "x", "no instances left") == (
        "Fleet status changed ACTIVE -> TERMINATING (no instances left)"
    )
    assert status_change_message("fleet", "submitted", "active") == "Fleet status changed SUBMITTED -> ACTIVE"
