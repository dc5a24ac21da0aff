"""Cron expressions of a run's ``schedule``: when they fire, in dstack 0.22.5's dialect (APScheduler 3's
``CronTrigger.from_crontab``, UTC). Pure: no clock; times are epoch seconds passed in.

The dialect, as APScheduler 3 reads it (and so unlike classic cron in two places):

- five fields: minute (0-59), hour (0-23), day (1-31), month (1-12), day_of_week (0-6 where **0 is
  Monday**, ``mon``..``sun``);
- each field a comma list of ``*``, ``*/S``, ``A``, ``A-B``, ``A-B/S``, ``A/S`` (from A to the field's
  maximum), names (``jan-mar``, ``mon-fri``); the day field also takes ``last`` (the month's last day).
  APScheduler's weekday positions (``2nd fri``) cannot be written in a crontab string, whose fields are split
  at whitespace (``from_crontab``), so neither here;
- a time fires when **every** field matches it (day and day_of_week together, not either of them).

``next_fire`` answers the first whole minute at or after a time (rounded up to the second, as
APScheduler does) when an expression fires; ``next_trigger`` the earliest over a schedule's expressions.
Expressions are assumed valid (``corral.config`` validates them); one that never fires within
``HORIZON_DAYS`` (``0 0 31 2 *``) answers None.
"""

from __future__ import annotations

import calendar
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
#: How far ``next_fire`` looks (the longest cycle of a valid expression that fires at all is 28 years:
#: February 29th on a given weekday).
HORIZON_DAYS = 29 * 366

_BOUNDS = {"minute": (0, 59), "hour": (0, 23), "day": (1, 31), "month": (1, 12), "day_of_week": (0, 6)}


@dataclass(frozen=True)
class DaySpec:
    """The day field: plain days of the month, plus ``last`` (the month's last day)."""

    days: frozenset[int]
    last: bool = False

    def matches(self, year: int, month: int, day: int) -> bool:
        return day in self.days or (self.last and day == calendar.monthrange(year, month)[1])


@dataclass(frozen=True)
class CronSpec:
    minutes: frozenset[int]
    hours: frozenset[int]
    day: DaySpec
    months: frozenset[int]
    weekdays: frozenset[int]

    def matches_date(self, year: int, month: int, day: int) -> bool:
        if month not in self.months:
            return False
        return calendar.weekday(year, month, day) in self.weekdays and self.day.matches(year, month, day)

    def matches(self, when: datetime) -> bool:
        """Whether the minute ``when`` (UTC, seconds ignored) is one this expression fires at."""
        return (
            when.minute in self.minutes
            and when.hour in self.hours
            and self.matches_date(when.year, when.month, when.day)
        )


def _values(field: str, part: str) -> set[int]:
    lo, hi = _BOUNDS[field]
    head, _, step_text = part.partition("/")
    step = int(step_text) if step_text else None
    names = MONTHS if field == "month" else WEEKDAYS if field == "day_of_week" else None
    if head == "*":
        first, last = lo, hi
    else:
        first_text, dash, last_text = head.partition("-")
        if names is not None and first_text.isalpha():
            base = 1 if field == "month" else 0
            first = names.index(first_text.lower()) + base
            last = names.index(last_text.lower()) + base if dash else first
        else:
            first = int(first_text)
            last = int(last_text) if dash else hi if step is not None else first
    return set(range(max(first, lo), min(last, hi) + 1, step or 1))


def parse(expression: str) -> CronSpec:
    """The expression's fields as sets (it must be valid: ``corral.config.common.validate_cron``)."""
    fields = expression.split()
    if len(fields) != 5:
        raise ValueError(f"invalid cron expression {expression!r}: expected 5 fields")
    parsed: dict[str, set[int]] = {}
    last = False
    for name, value in zip(("minute", "hour", "day", "month", "day_of_week"), fields, strict=True):
        out: set[int] = set()
        for raw in value.split(","):
            part = raw.strip()
            words = part.lower().split()
            if name == "day" and words == ["last"]:
                last = True
            else:
                out |= _values(name, part)
        parsed[name] = out
    return CronSpec(
        minutes=frozenset(parsed["minute"]),
        hours=frozenset(parsed["hour"]),
        day=DaySpec(frozenset(parsed["day"]), last),
        months=frozenset(parsed["month"]),
        weekdays=frozenset(parsed["day_of_week"]),
    )


def next_fire(expression: str | CronSpec, after: float) -> float | None:
    """The first time at or after ``after`` (epoch seconds, rounded up to the second) at which the
    expression fires, as epoch seconds of a whole minute; None if it never does within the horizon."""
    spec = parse(expression) if isinstance(expression, str) else expression
    start = datetime.fromtimestamp(math.ceil(after), tz=timezone.utc)
    if start.second:
        start = start.replace(second=0) + timedelta(minutes=1)
    hours = sorted(spec.hours)
    minutes = sorted(spec.minutes)
    day = start.date()
    for offset in range(HORIZON_DAYS):
        if offset:
            day += timedelta(days=1)
        if not spec.matches_date(day.year, day.month, day.day):
            continue
        floor = (start.hour, start.minute) if offset == 0 else (0, 0)
        for hour in hours:
            if hour < floor[0]:
                continue
            for minute in minutes:
                if (hour, minute) >= floor:
                    found = datetime(day.year, day.month, day.day, hour, minute, tzinfo=timezone.utc)
                    return found.timestamp()
    return None


def next_trigger(crons: Iterable[str], after: float) -> float | None:
    """The earliest ``next_fire`` over a schedule's expressions (dstack: the minimum of their next fire times)."""
    times = [t for t in (next_fire(c, after) for c in crons) if t is not None]
    return min(times) if times else None


def never_firing(crons: Sequence[str], now: float) -> list[str]:
    """The expressions of ``crons`` that never fire (``0 0 31 2 *``), for a clear refusal at submission."""
    return [c for c in crons if next_fire(c, now) is None]
