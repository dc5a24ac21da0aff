"""The Prometheus text format (version 0.0.4) and the counters a server process keeps in memory.

:class:`Telemetry` holds counters and histograms by name and label values (one per server process, on the
workers' context; a Prometheus server scrapes every replica). :func:`render` writes metric families as
dstack's ``/metrics`` does: ``# HELP``, ``# TYPE``, then one ``name{label="value",...} value`` line per
sample, label values escaped as the format says; a sample's labels may come as their block rendered once and
kept (:class:`LabelBlocks`: a scrape's cost per series is mostly its labels). Pure values: no I/O, no clocks.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]

#: dstack's buckets of ``dstack_submit_to_provision_duration_seconds`` (seconds).
PROVISION_BUCKETS = (15, 30, 45, 60, 90, 120, 180, 240, 300, 360, 420, 480, 540, 600, 900, 1200, 1800)
#: ``corral_queue_wait_seconds``: from well under a second (an idle fleet) to a day in the queue.
QUEUE_WAIT_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600)


@dataclass
class Family:
    name: str
    type: str  # counter | gauge | histogram
    help: str
    #: (sample name, labels or their block rendered once (:class:`LabelBlocks`), value: an int kept as one)
    samples: list[tuple[str, Labels | str, float]] = field(default_factory=list)

    def add(self, labels: dict[str, str] | Labels | str, value: float, suffix: str = "") -> None:
        items = labels if isinstance(labels, (str, tuple)) else tuple(labels.items())
        number = value if type(value) is int else float(value)  # a count is written without going through a float
        self.samples.append((self.name + suffix if suffix else self.name, items, number))


def label_block(labels: Labels) -> str:
    """What a sample's ``{...}`` holds: ``name="value"`` pairs, each value escaped as the format says."""
    return ",".join(f'{k}="{_escape(v)}"' for k, v in labels)


class LabelBlocks:
    """The label blocks of one set of label names (:func:`label_block`), rendered once and kept by their values
    while those values are seen (a series' labels rarely change: a run count's are a project and a user name).
    At most ``limit`` are kept; beyond it the kept ones are dropped and rendered again as they come."""

    def __init__(self, names: tuple[str, ...], limit: int = 100_000) -> None:
        self._names = names
        self._limit = limit
        self._kept: dict[tuple[str, ...], str] = {}

    def __call__(self, values: tuple[str, ...]) -> str:
        block = self._kept.get(values)
        if block is None:
            if len(self._kept) >= self._limit:
                self._kept.clear()
            block = self._kept[values] = label_block(tuple(zip(self._names, values, strict=True)))
        return block


@dataclass
class _Histogram:
    buckets: tuple[float, ...]
    counts: list[int]
    total: float = 0.0
    count: int = 0


class Telemetry:
    """Counters and histograms of this process, safe to update from any thread."""

    COUNTERS = {
        "corral_placements_total": "Jobs the scheduler placed (on an idle instance or a new one)",
        "corral_commit_rejections_total": "Gangs the commit point refused (capacity taken meanwhile; re-planned)",
        "corral_preemptions_total": "Runs (gangs) stopped to make room for a waiting run (scheduling.preemption)",
        "corral_proxy_requests_total": "Requests the in-server proxy answered, by service and status code",
    }
    HISTOGRAMS = {
        "dstack_submit_to_provision_duration_seconds": (
            "Time from when a run has been submitted and first job provisioning",
            PROVISION_BUCKETS,
        ),
        "corral_queue_wait_seconds": ("Time jobs waited in the queue before they were placed", QUEUE_WAIT_BUCKETS),
    }

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, dict[Labels, float]] = {name: {} for name in self.COUNTERS}
        self._histograms: dict[str, dict[Labels, _Histogram]] = {name: {} for name in self.HISTOGRAMS}

    def inc(self, name: str, labels: dict[str, str] | None = None, by: float = 1.0) -> None:
        key = tuple((labels or {}).items())
        with self._lock:
            series = self._counters[name]
            series[key] = series.get(key, 0.0) + by

    def observe(self, name: str, value: float, labels: dict[str, str] | None = None) -> None:
        key = tuple((labels or {}).items())
        buckets = self.HISTOGRAMS[name][1]
        with self._lock:
            h = self._histograms[name].get(key)
            if h is None:
                h = self._histograms[name][key] = _Histogram(tuple(map(float, buckets)), [0] * len(buckets))
            i = bisect.bisect_left(h.buckets, value)
            if i < len(h.counts):
                h.counts[i] += 1
            h.total += value
            h.count += 1

    def counter(self, name: str, labels: dict[str, str] | None = None) -> float:
        with self._lock:
            return self._counters[name].get(tuple((labels or {}).items()), 0.0)

    def families(self) -> list[Family]:
        out: list[Family] = []
        with self._lock:
            for name, help_text in self.COUNTERS.items():
                fam = Family(name, "counter", help_text)
                for key, value in sorted(self._counters[name].items()):
                    fam.add(key, value)
                out.append(fam)
            for name, (help_text, _) in self.HISTOGRAMS.items():
                fam = Family(name, "histogram", help_text)
                for key, h in sorted(self._histograms[name].items()):
                    running = 0
                    for bound, n in zip(h.buckets, h.counts, strict=True):
                        running += n
                        fam.add((*key, ("le", _number(bound))), running, "_bucket")
                    fam.add((*key, ("le", "+Inf")), h.count, "_bucket")
                    fam.add(key, h.count, "_count")
                    fam.add(key, h.total, "_sum")
                out.append(fam)
        return out


def _escape(value: str) -> str:
    if "\\" not in value and "\n" not in value and '"' not in value:
        return value
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if type(value) is int:
        if -(2**53) < value < 2**53:
            return f"{value}.0"  # as a float's "{:.1f}" writes it
        value = float(value)
    if value.is_integer() and abs(value) < 2**53:
        return f"{value:.1f}"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


def _lines(families: Iterable[Family]) -> Iterator[str]:
    rendered: dict[Labels, str] = {}  # a job's labels appear in many families: each set is escaped once
    for fam in families:
        if not fam.samples:
            continue
        yield f"# HELP {fam.name} {fam.help}"
        yield f"# TYPE {fam.name} {fam.type}"
        for name, labels, value in fam.samples:
            if isinstance(labels, str):
                inner = labels
            else:
                known = rendered.get(labels)
                if known is None:
                    known = rendered[labels] = label_block(labels)
                inner = known
            yield f"{name}{{{inner}}} {_number(value)}" if inner else f"{name} {_number(value)}"


def render(families: Sequence[Family]) -> str:
    """The text exposition of the families that have samples."""
    text = "\n".join(_lines(families))
    return text + "\n" if text else ""
