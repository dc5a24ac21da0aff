"""A job follower's next step, decided without I/O from the job as stored, the time and the job's policies:
poll the agent (for how long, and whether to look at the job's utilisation first), send it a stop, record that a
dev environment went idle, or end."""

from __future__ import annotations

import dataclasses
from typing import Any

from test_job_container import _job

from corral.workers.jobs.follower import Current, Finish, Idle, Policies, Poll, SendStop, next_step

NOW = 1_000.0
PLAIN = Policies(poll_wait=30.0)


def _step(policies: Policies = PLAIN, stop_sent: str | None = None, due: float = 0.0, **job: Any) -> object:
    current = Current(dataclasses.replace(_job(), **job), stop_sent=stop_sent, utilization_due=due)
    return next_step(current, NOW, policies)


def test_a_job_gone_or_ended_finishes_the_follower() -> None:
    assert next_step(Current(None), NOW, PLAIN) == Finish()
    for status in ("done", "failed", "terminated", "aborted"):
        assert _step(status=status) == Finish()


def test_a_plain_job_is_polled_for_the_whole_wait() -> None:
    assert _step() == Poll(30.0)
    assert _step(status="pulling") == Poll(30.0)
    assert _step(status="provisioning") == Poll(30.0)


def test_a_stop_asked_for_is_sent_once_then_polled() -> None:
    assert _step(stop_requested="terminate") == SendStop("terminate", 30.0)
    assert _step(stop_requested="abort") == SendStop("abort", 30.0, abort=True)
    assert _step(stop_requested="abort", stop_sent="abort") == Poll(30.0)
    # a stronger stop after a weaker one is sent again
    assert _step(stop_requested="abort", stop_sent="terminate") == SendStop("abort", 30.0, abort=True)


def test_a_preempted_job_gets_a_deadline_and_its_message() -> None:
    policies = dataclasses.replace(PLAIN, preemption_grace=120.0)
    step = _step(policies, stop_requested="preempted", termination_reason_message="run b took its place")
    assert step == SendStop("preempted", 30.0, deadline=NOW + 120.0, message="run b took its place")


def test_a_dev_environment_idle_past_its_limit_is_stopped() -> None:
    policies = dataclasses.replace(PLAIN, idle_limit=60)
    step = _step(policies, ssh_seen_at=NOW - 61)
    assert isinstance(step, Idle) and "inactive for 61 seconds" in step.message
    # not idle yet: polled until the limit, no later (and never for less than half a second)
    assert _step(policies, ssh_seen_at=NOW - 50) == Poll(10.1)
    assert _step(policies, ssh_seen_at=NOW - 59.9) == Poll(0.5)
    # a stop asked for already, or a job not running yet, is not idle
    assert _step(policies, ssh_seen_at=NOW - 61, stop_requested="abort") == SendStop("abort", 30.0, abort=True)
    assert _step(policies, ssh_seen_at=NOW - 61, status="pulling") == Poll(30.0)


def test_a_utilization_policy_is_looked_at_every_so_often() -> None:
    policies = dataclasses.replace(PLAIN, utilization_policy=(10, 600.0), utilization_every=20.0)
    assert _step(policies) == Poll(20.0, check_utilization=True)
    assert _step(policies, due=NOW + 5) == Poll(5.0)
    assert _step(policies, due=NOW + 0.1) == Poll(0.5)
    assert _step(policies, stop_requested="utilization") == SendStop("utilization", 30.0)
