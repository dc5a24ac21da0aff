"""A dev environment's ``inactivity_duration``, as dstack 0.22.5 applies it: the job ends once no SSH
connection has been open for that long. A connection counts only once it has been open for
:data:`MIN_CONNECTION_S` (dstack's runner ignores shorter ones, "likely from dstack-server"); an open one
keeps the job alive; the clock starts when the job starts running. Pure: ``now`` is a parameter.
"""

from __future__ import annotations

MIN_CONNECTION_S = 10.0


def counts(opened_at: float, now: float) -> bool:
    """Whether a connection opened at ``opened_at`` counts as activity at ``now``."""
    return now - opened_at >= MIN_CONNECTION_S


def inactive_secs(seen_at: float, now: float) -> int:
    """Seconds without a connection that counts (``seen_at``: the last one seen, or the job's start)."""
    return max(0, int(now - seen_at))


def exceeded(seen_at: float | None, duration: int | None, now: float) -> bool:
    return seen_at is not None and duration is not None and duration > 0 and now - seen_at >= duration


def message(inactive: int, duration: int) -> str:
    """dstack's ``termination_reason_message`` of a job it ended for inactivity."""
    return f"The job was inactive for {inactive} seconds, exceeding the inactivity_duration of {duration} seconds"


def duration_of(configuration: dict[str, object]) -> int | None:
    """The configuration's ``inactivity_duration`` in seconds (None: off, or not a dev environment)."""
    if configuration.get("type") != "dev-environment":
        return None
    value = configuration.get("inactivity_duration")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
