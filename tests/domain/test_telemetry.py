"""The process's counters and histograms, rendered in the Prometheus text format."""

from __future__ import annotations

import math

import pytest

from corral.domain.telemetry import PROVISION_BUCKETS, Family, LabelBlocks, Telemetry, label_block, render


def test_counters_add_up_by_label_values() -> None:
    t = Telemetry()
    t.inc("corral_placements_total")
    t.inc("corral_placements_total", by=2)
    t.inc("corral_proxy_requests_total", {"service": "a", "code": "200"})
    assert t.counter("corral_placements_total") == 3.0
    assert t.counter("corral_proxy_requests_total", {"service": "a", "code": "200"}) == 1.0
    assert t.counter("corral_proxy_requests_total", {"service": "b", "code": "200"}) == 0.0


def test_an_unknown_metric_name_is_refused() -> None:
    with pytest.raises(KeyError):
        Telemetry().inc("corral_typo_total")


def test_a_histogram_counts_each_bucket_cumulatively_with_a_value_on_a_bound_in_that_bucket() -> None:
    t = Telemetry()
    for v in (15, 16, 5000):  # on the first bound, in the second, above all
        t.observe("dstack_submit_to_provision_duration_seconds", v)
    fam = {f.name: f for f in t.families()}["dstack_submit_to_provision_duration_seconds"]
    # this process's own series keep their labels as pairs (a rendered block is a string: no "le" in it)
    buckets = {
        dict(labels if isinstance(labels, tuple) else ())["le"]: v
        for name, labels, v in fam.samples
        if name.endswith("_bucket")
    }
    assert buckets["15.0"] == 1 and buckets["30.0"] == 2 and buckets["1800.0"] == 2 and buckets["+Inf"] == 3
    assert len(buckets) == len(PROVISION_BUCKETS) + 1
    rest = {name: v for name, _, v in fam.samples if not name.endswith("_bucket")}
    assert rest == {
        "dstack_submit_to_provision_duration_seconds_count": 3,
        "dstack_submit_to_provision_duration_seconds_sum": 5031,
    }


def test_the_exposition_has_help_type_and_one_line_per_sample() -> None:
    t = Telemetry()
    t.inc("corral_preemptions_total", {"project": "main"})
    t.observe("corral_queue_wait_seconds", 0.25, {"project": "main"})
    text = render(t.families())
    assert text.endswith("\n")
    lines = text.splitlines()
    assert lines[:3] == [
        "# HELP corral_preemptions_total Runs (gangs) stopped to make room for a waiting run (scheduling.preemption)",
        "# TYPE corral_preemptions_total counter",
        'corral_preemptions_total{project="main"} 1.0',
    ]
    assert "# TYPE corral_queue_wait_seconds histogram" in lines
    assert 'corral_queue_wait_seconds_bucket{project="main",le="0.5"} 1.0' in lines
    assert 'corral_queue_wait_seconds_bucket{project="main",le="0.1"} 0.0' in lines
    assert 'corral_queue_wait_seconds_sum{project="main"} 0.25' in lines
    # families without samples are left out
    assert "corral_placements_total" not in text


def test_nothing_to_render_is_the_empty_text() -> None:
    assert render(Telemetry().families()) == ""
    assert render([Family("x", "gauge", "none")]) == ""


def test_label_values_are_escaped_and_values_spelled_as_the_format_says() -> None:
    fam = Family("corral_x", "gauge", "x")
    fam.add({"path": 'a\\b "c"\nd'}, 1)
    fam.add({}, 2**60)
    fam.add((), math.inf)
    fam.add((), -math.inf)
    fam.add((), math.nan)
    fam.add((), 0.5, "_sum")
    lines = render([fam]).splitlines()[2:]
    assert lines == [
        'corral_x{path="a\\\\b \\"c\\"\\nd"} 1.0',
        "corral_x 1.152921504606847e+18",
        "corral_x +Inf",
        "corral_x -Inf",
        "corral_x NaN",
        "corral_x_sum 0.5",
    ]


def test_a_label_block_is_rendered_once_kept_by_its_values_and_dropped_beyond_the_limit() -> None:
    blocks = LabelBlocks(("project", "user"), limit=2)
    first = blocks(('q"x', "a\\b\nc"))
    assert first == 'project="q\\"x",user="a\\\\b\\nc"'
    assert blocks(('q"x', "a\\b\nc")) is first  # kept
    blocks(("p", "u"))
    assert blocks(("r", "v")) == 'project="r",user="v"'  # a third: the kept ones dropped, this one kept
    assert blocks(('q"x', "a\\b\nc")) == first and blocks(('q"x', "a\\b\nc")) is not first
    fam = Family("dstack_run_count_total", "counter", "Total runs count")
    fam.add(first, 7)
    fam.add(blocks(("r", "v")), 0.5)
    assert render([fam]).splitlines()[2:] == [
        'dstack_run_count_total{project="q\\"x",user="a\\\\b\\nc"} 7.0',
        'dstack_run_count_total{project="r",user="v"} 0.5',
    ]
    assert label_block(()) == ""


def test_counts_are_written_as_their_float_would_be() -> None:
    fam = Family("corral_x", "gauge", "x")
    for value in (0, -3, 2**53 - 1, 2**53, -(2**53), 2**60, True):
        fam.add((), value)
    assert [v for _, _, v in fam.samples][:2] == [0, -3]
    assert render([fam]).splitlines()[2:] == [
        f"corral_x {float(v):.1f}" if abs(v) < 2**53 else f"corral_x {float(v)!r}"
        for v in (0, -3, 2**53 - 1, 2**53, -(2**53), 2**60, 1)
    ]
