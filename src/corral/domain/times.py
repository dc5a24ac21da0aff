"""Instants from the wire as seconds since the Unix epoch, for every datetime a request may carry.

``datetime.timestamp()`` fails for instants near year 1 or 9999 once a time zone offset moves them out
of the calendar ("year 0 is out of range"); the difference from the epoch never does. A naive datetime
is UTC, as dstack reads it. Pure: no clock.
"""

from __future__ import annotations

from datetime import datetime, timezone

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def epoch_seconds(value: datetime) -> float:
    """``value`` as seconds since the epoch (negative before 1970)."""
    if value.tzinfo is None or value.utcoffset() is None:
        value = value.replace(tzinfo=timezone.utc)
    return (value - _EPOCH).total_seconds()
