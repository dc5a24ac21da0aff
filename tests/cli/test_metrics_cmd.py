"""``corral metrics RUN``: one row per job with its latest CPU, memory and GPU values; "-" before the first
samples; ``--job`` narrows to a job the run has, else a clear error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cli_fakes import FakeClient, Result, make_run

CLI = Callable[..., Result]
TS = ["2026-12-01T17:00:02.000000Z"]


def _series(**values: Any) -> dict[str, Any]:
    return {"metrics": [{"name": k, "timestamps": TS, "values": [v]} for k, v in values.items()]}


def test_metrics_shows_each_jobs_latest_values(fake: FakeClient, cli: CLI) -> None:
    fake.runs["train"] = [make_run("train", "running")]
    fake.metrics = _series(
        cpu_usage_percent=153,
        memory_working_set_bytes=2 * 10**9,
        memory_total_bytes=16 * 10**9,
        gpus_detected_num=1,
        gpu_memory_total_bytes=80 * 10**9,
        gpu_memory_usage_bytes_gpu0=40 * 10**9,
        gpu_util_percent_gpu0=93,
    )
    result = cli("metrics", "train")
    assert result.code == 0, result.err
    (row,) = [line for line in result.out.splitlines() if line.strip().startswith("train-0-0")]
    assert row.split() == ["train-0-0", "running", "153%", "2.0GB/16.0GB", "gpu=0", "93%", "40.0GB/80.0GB"]
    assert ("job_metrics", ("main", "train", 0, 0, 1), {}) in fake.calls


def test_metrics_before_samples_and_of_a_missing_job(fake: FakeClient, cli: CLI) -> None:
    fake.runs["train"] = [make_run("train", "running")]
    result = cli("metrics", "train")
    (row,) = [line for line in result.out.splitlines() if line.strip().startswith("train-0-0")]
    assert row.split() == ["train-0-0", "running", "-", "-", "-"]
    missing = cli("metrics", "train", "--job", "3")
    assert (missing.code, missing.err) == (1, "Error: Run train has no job matching job=3\n")
    assert cli("metrics", "nope").code == 1
