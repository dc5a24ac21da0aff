"""A dev environment's inactivity, as dstack 0.22.5 counts it (``corral.domain.inactivity``)."""

from __future__ import annotations

from corral.domain import inactivity


def test_a_connection_counts_only_after_ten_seconds() -> None:
    assert not inactivity.counts(100.0, 109.9)
    assert inactivity.counts(100.0, 110.0)


def test_the_job_ends_after_its_duration_without_a_connection_that_counts() -> None:
    started = 1000.0
    assert not inactivity.exceeded(started, 30, started + 29.9)
    assert inactivity.exceeded(started, 30, started + 30)
    # an open session records itself every few seconds: the clock starts again from each record
    seen = started + 25
    assert not inactivity.exceeded(seen, 30, started + 40)
    assert not inactivity.exceeded(None, 30, started + 1e6), "a job not yet running is never idle"
    assert not inactivity.exceeded(started, None, started + 1e6)


def test_dstacks_message_and_duration() -> None:
    assert inactivity.message(31, 30) == (
        "The job was inactive for 31 seconds, exceeding the inactivity_duration of 30 seconds"
    )
    assert inactivity.inactive_secs(100.0, 131.7) == 31
    assert inactivity.duration_of({"type": "dev-environment", "inactivity_duration": 3600}) == 3600
    assert inactivity.duration_of({"type": "dev-environment", "inactivity_duration": None}) is None
    assert inactivity.duration_of({"type": "task", "inactivity_duration": 60}) is None
