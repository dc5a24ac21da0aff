"""dstack's duration grammar: an int number of seconds or `<n>[smhdw]` (`30m`, `1d`), plus the
"offable" variants (`off`/`false`) used by profile parameters. Pure functions, standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 24 * 3600, "w": 7 * 24 * 3600}
_DURATION_RE = re.compile(r"(?P<amount>\d+) *(?P<unit>[smhdw])$")

OFF = "off"
IDLE_OFF = -1


def parse_duration(value: object) -> int:
    """Seconds from `120`, `"120"`, `"30m"`, `"2h"`, `"1d"`, `"1w"`. Floats are truncated (as dstack)."""
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
        match = _DURATION_RE.match(value)
        if match is None:
            raise ValueError(
                f"cannot parse the duration {value!r}: use seconds or <number><s|m|h|d|w>, e.g. 90, 30m, 2h"
            )
        return int(match.group("amount")) * _UNIT_SECONDS[match.group("unit")]
    raise ValueError(f"cannot parse the duration {value!r}: use seconds or <number><s|m|h|d|w>")


def parse_off_duration(value: object) -> Literal["off"] | int | None:
    """An "offable" duration: `off`/`false` -> "off", `true`/None -> None (default), else seconds >= 0."""
    if value is False or value == OFF:
        return "off"
    if value is True or value is None:
        return None
    seconds = parse_duration(value)
    if seconds < 0:
        raise ValueError("duration cannot be negative; use `off` to disable")
    return seconds


def parse_idle_duration(value: object) -> int | None:
    """An idle duration: `off`/`false`/-1 -> -1; `true`/None -> None; else seconds (negatives kept)."""
    if value is False or value == OFF or (not isinstance(value, bool) and value == IDLE_OFF):
        return IDLE_OFF
    if value is True or value is None:
        return None
    return parse_duration(value)


def format_duration(seconds: int) -> str:
    """The shortest exact `<n><unit>` text for `seconds` (`3600` -> `1h`, `90` -> `90s`)."""
    if seconds <= 0:
        return f"{seconds}s"
    for unit in ("w", "d", "h", "m"):
        size = _UNIT_SECONDS[unit]
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def run_idle_duration(run_spec: Mapping[str, object]) -> int | None:
    """A stored run spec's own ``idle_duration`` (its configuration's, else its profile's, as the merged
    profile takes it): seconds, -1 for ``off``, None where the run sets none or the value does not parse."""
    for part in ("configuration", "profile"):
        section = run_spec.get(part)
        value = section.get("idle_duration") if isinstance(section, Mapping) else None
        if value is not None:
            try:
                return parse_idle_duration(value)
            except ValueError:
                return None
    return None


def shorter_idle(fleet: float | None, run: float | None) -> float | None:
    """The idle duration of an instance created for a run (as dstack's: the shorter of the fleet's and the
    run's; -1 is ``off``, no limit); None where neither sets one (the fleets' default applies)."""
    if run is None:
        return fleet
    if fleet is None or fleet < 0:
        return run
    if run < 0:
        return fleet
    return min(fleet, run)


#: Backends whose instances end with their job unless the fleet or the run sets ``idle_duration``: an idle
#: Slurm allocation would hold nodes other users of a shared cluster are queueing for.
ENDS_WITH_ITS_JOB = frozenset({"slurm"})


def idle_limit(row_idle: float | None, backend: str, default: float) -> float:
    """How long an idle instance stays: its own ``idle_duration``, else 0 on a backend whose instances end with
    their job, else the server's default."""
    if row_idle is not None:
        return row_idle
    return 0.0 if backend in ENDS_WITH_ITS_JOB else default
