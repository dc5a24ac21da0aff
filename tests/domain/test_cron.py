"""The cron evaluator of ``schedule`` (``corral.domain.cron``): against a brute-force minute-by-minute
scan (Hypothesis), and against APScheduler 3's ``CronTrigger.from_crontab`` as dstack 0.22.5's server
uses it (the dstack virtualenv of the configuration tests), on the same generated expressions."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.config.common import validate_cron
from corral.domain.cron import never_firing, next_fire, next_trigger, parse

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "config"))
from _dstack_oracle import dstack_python

HORIZON_MINUTES = 3 * 24 * 60
START = datetime(2024, 1, 1, tzinfo=timezone.utc).timestamp()  # a leap year: February 29th is in range


def _numeric(lo: int, hi: int) -> st.SearchStrategy[str]:
    value = st.integers(lo, hi)
    single = value.map(str)
    ranged = st.tuples(value, value).map(lambda p: f"{min(p)}-{max(p)}")
    stepped = st.tuples(value, st.integers(1, max(1, hi - lo))).filter(lambda p: p[1] <= hi - p[0] or p[0] == hi)
    every = st.integers(1, hi - lo).map(lambda s: f"*/{s}")
    part = st.one_of(single, ranged, stepped.map(lambda p: f"{p[0]}/{p[1]}" if p[0] < hi else str(p[0])), every)
    return st.one_of(st.just("*"), st.lists(part, min_size=1, max_size=3).map(",".join))


_WEEKDAY_NAMES = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_DAY_SPECIAL = st.one_of(
    st.just("last"),
    st.tuples(st.sampled_from(("1st", "2nd", "3rd", "4th", "5th", "last")), st.sampled_from(_WEEKDAY_NAMES)).map(
        " ".join
    ),
)
_WEEKDAY = st.one_of(
    _numeric(0, 6),
    st.tuples(st.integers(0, 6), st.integers(0, 6)).map(lambda p: f"{_WEEKDAY_NAMES[min(p)]}-{_WEEKDAY_NAMES[max(p)]}"),
)
EXPRESSIONS = st.tuples(
    _numeric(0, 59),
    _numeric(0, 23),
    st.one_of(_numeric(1, 31), _DAY_SPECIAL),
    st.one_of(st.just("*"), _numeric(1, 12)),
    _WEEKDAY,
).map(" ".join)


def _valid(expression: str) -> bool:
    try:
        validate_cron(expression)
    except ValueError:
        return False
    return True


def _brute_force(expression: str, after: float) -> float | None:
    spec = parse(expression)
    t = datetime.fromtimestamp(after, tz=timezone.utc).replace(second=0, microsecond=0)
    if t.timestamp() < after:
        t += timedelta(minutes=1)
    for _ in range(HORIZON_MINUTES):
        if spec.matches(t):
            return t.timestamp()
        t += timedelta(minutes=1)
    return None


@settings(max_examples=150, deadline=None)
@given(EXPRESSIONS.filter(_valid), st.floats(0, 400 * 86400, allow_nan=False))
def test_next_fire_is_the_first_matching_minute(expression: str, offset: float) -> None:
    after = START + offset
    found = next_fire(expression, after)
    reference = _brute_force(expression, after)
    if reference is not None:
        assert found == reference, (expression, after)
    else:  # nothing in the scanned window: the answer is beyond it (or never)
        assert found is None or found >= after + (HORIZON_MINUTES - 1) * 60, (expression, after, found)
    if found is not None:
        assert found >= after and parse(expression).matches(datetime.fromtimestamp(found, tz=timezone.utc))


def test_the_dialect_is_apscheduler_s() -> None:
    monday = datetime(2026, 11, 30, 10, 0, 30, tzinfo=timezone.utc).timestamp()  # a Monday, 10:00:30
    # 0 is Monday (not Sunday as in classic cron)
    assert datetime.fromtimestamp(next_fire("0 9 * * 0", monday) or 0, tz=timezone.utc).weekday() == 0
    # day and day_of_week must both match (classic cron: either)
    at = next_fire("0 0 1 * fri", monday) or 0
    assert datetime.fromtimestamp(at, tz=timezone.utc).date().isoformat() == "2027-01-01"
    # a time already past its second waits for the next whole minute; an exact minute fires at once
    assert next_fire("* * * * *", monday) == monday + 30
    assert next_fire("* * * * *", monday - 30) == monday - 30
    assert next_fire("0 0 31 2 *", monday) is None
    assert next_trigger(["0 12 * * *", "15 10 * * *"], monday) == monday - 30 + 15 * 60


def test_next_fire_agrees_with_apscheduler() -> None:
    """The same expressions and times through dstack's own evaluator (one subprocess)."""
    rng = random.Random(25)
    cases: list[tuple[str, float]] = []
    for _ in range(400):
        cases.append((_sample(rng), START + rng.uniform(0, 3 * 365 * 86400)))
    script = r"""
import json, sys
from datetime import datetime, timezone
from apscheduler.triggers.cron import CronTrigger
out = []
for expression, after in json.load(sys.stdin):
    now = datetime.fromtimestamp(after, tz=timezone.utc)
    fire = CronTrigger.from_crontab(expression, timezone=timezone.utc).get_next_fire_time(None, now)
    out.append(None if fire is None else fire.timestamp())
json.dump(out, sys.stdout)
"""
    proc = subprocess.run(
        [str(dstack_python()), "-c", script], input=json.dumps(cases), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    expected = json.loads(proc.stdout)
    for (expression, after), theirs in zip(cases, expected, strict=True):
        assert next_fire(expression, after) == theirs, (expression, after)


def _sample(rng: random.Random) -> str:
    """A valid expression drawn without Hypothesis (its ``example()`` is not for tests)."""
    while True:

        def numeric(lo: int, hi: int) -> str:
            kind = rng.randrange(5)
            a, b = sorted((rng.randint(lo, hi), rng.randint(lo, hi)))
            if kind == 0:
                return "*"
            if kind == 1:
                return ",".join(str(rng.randint(lo, hi)) for _ in range(rng.randint(1, 3)))
            if kind == 2:
                return f"{a}-{b}"
            if kind == 3:
                return f"*/{rng.randint(1, hi - lo)}"
            return f"{a}-{b}/{rng.randint(1, max(1, b - a))}" if b > a else str(a)

        day = rng.choice([numeric(1, 31), "*", "last", f"{rng.choice(('1st', '3rd', '5th', 'last'))} "
                          f"{rng.choice(_WEEKDAY_NAMES)}"])  # fmt: skip
        weekday = rng.choice(["*", numeric(0, 6), "mon-fri", "sat,sun"])
        expression = " ".join((numeric(0, 59), numeric(0, 23), day, rng.choice(["*", numeric(1, 12)]), weekday))
        if _valid(expression):
            return expression


def test_an_expression_needs_five_fields() -> None:
    with pytest.raises(ValueError, match="expected 5 fields"):
        parse("0 0 * *")


def test_never_firing_names_the_expressions_that_never_fire() -> None:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()
    assert never_firing(["0 0 31 2 *", "0 0 * * *", "0 0 30 2 *"], now) == ["0 0 31 2 *", "0 0 30 2 *"]


def test_a_weekday_position_cannot_be_written_in_a_crontab_string() -> None:
    """APScheduler's ``from_crontab`` (dstack's reader) splits at whitespace, so ``2nd fri`` makes six fields."""
    with pytest.raises(ValueError, match="expected 5 fields"):
        parse("0 9 2nd fri * *")


def test_a_minute_matches_only_when_every_field_does() -> None:
    spec = parse("30 9 * * mon")
    assert spec.matches(datetime(2026, 11, 30, 9, 30, 59, tzinfo=timezone.utc))  # a Monday; seconds ignored
    assert not spec.matches(datetime(2026, 11, 30, 9, 31, tzinfo=timezone.utc))
    assert not spec.matches(datetime(2026, 11, 30, 10, 30, tzinfo=timezone.utc))
    assert not spec.matches(datetime(2026, 12, 1, 9, 30, tzinfo=timezone.utc))  # a Tuesday
