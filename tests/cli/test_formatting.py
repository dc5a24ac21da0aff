"""Formatting matches dstack 0.22.5's CLI (expected strings produced by dstack itself)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from corral.cli import formatting as f

DEFAULT_TASK: dict[str, Any] = {
    "cpu": {"arch": None, "count": {"min": 2, "max": None}},
    "memory": {"min": 8.0, "max": None},
    "shm_size": None,
    "gpu": {
        "vendor": None,
        "name": None,
        "count": {"min": 0, "max": None},
        "memory": None,
        "total_memory": None,
        "compute_capability": None,
    },
    "disk": {"size": {"min": 100.0, "max": None}},
}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (DEFAULT_TASK, "cpu=2.. mem=8GB.. disk=100GB.. gpu=0.."),
        (
            {
                "cpu": {"arch": "x86", "count": {"min": 2, "max": None}},
                "memory": {"min": 8.0, "max": None},
                "gpu": {
                    "vendor": None,
                    "name": ["A100"],
                    "count": {"min": 2, "max": 2},
                    "memory": {"min": 40.0, "max": 40.0},
                    "total_memory": None,
                    "compute_capability": None,
                },
                "disk": {"size": {"min": 100.0, "max": None}},
            },
            "cpu=x86:2.. mem=8GB.. disk=100GB.. gpu=A100:40GB:2",
        ),
        (
            {
                **DEFAULT_TASK,
                "memory": {"min": 0.5, "max": 1024.0},
                "gpu": {**DEFAULT_TASK["gpu"], "vendor": "nvidia"},
            },
            "cpu=2.. mem=0.5GB..1024GB disk=100GB.. gpu=nvidia:0..",
        ),
        (
            {
                **DEFAULT_TASK,
                "gpu": {
                    **DEFAULT_TASK["gpu"],
                    "name": ["H100", "A100"],
                    "count": {"min": 1, "max": 2},
                    "memory": {"min": 40.0, "max": None},
                },
            },
            "cpu=2.. mem=8GB.. disk=100GB.. gpu=H100,A100:40GB..:1..2",
        ),
        (
            {**DEFAULT_TASK, "disk": None, "cpu": {"arch": None, "count": {"min": 1, "max": None}}},
            "cpu=1.. mem=8GB.. gpu=0..",
        ),
        (None, ""),
    ],
)
def test_resources_spec(spec: dict[str, Any] | None, expected: str) -> None:
    assert f.format_resources_spec(spec) == expected


GPU_BOX = {
    "cpus": 8,
    "memory_mib": 32768,
    "gpus": [{"name": "A100", "memory_mib": 81920, "vendor": "nvidia"}] * 2,
    "spot": True,
    "disk": {"size_mib": 102400},
    "cpu_arch": None,
}
SMALL = {"cpus": 2, "memory_mib": 512, "gpus": [], "spot": False, "disk": {"size_mib": 0}, "cpu_arch": "arm"}


def test_instance_resources() -> None:
    assert f.format_instance_resources(GPU_BOX) == "cpu=8 mem=32GB disk=100GB gpu=A100:80GB:2"
    assert f.format_instance_resources(GPU_BOX, include_spot=True) == "cpu=8 mem=32GB disk=100GB gpu=A100:80GB:2 (spot)"
    assert f.format_instance_resources(GPU_BOX, gpu_only=True) == "gpu=A100:80GB:2"
    assert f.format_instance_resources(SMALL) == "cpu=arm:2 mem=0.5GB"
    assert f.format_instance_resources(SMALL, gpu_only=True) == "-"


def test_prices_backends_nodes() -> None:
    assert f.format_price(0.0) == "$0"
    assert f.format_price(1.23450) == "$1.2345"
    assert f.format_price(2.5, spot=True) == "$2.5 (spot)"
    assert f.format_max_price(None) == "off"
    assert f.format_max_price(1.5) == "$1.5"
    assert f.format_backend("remote", None) == "ssh"
    assert f.format_backend("remote", None, "local") == "local"
    assert f.format_backend("aws", "us-east-1") == "aws (us-east-1)"
    assert f.format_backend("remote", "local") == "local"
    assert f.format_backend("remote", "local", "local") == "local"
    assert f.format_backend("remote", "10.0.0.2") == "ssh (10.0.0.2)"
    assert f.format_backend(None) == "-"
    assert f.format_nodes({"min": 0, "max": 3}) == "0..3"
    assert f.format_nodes({"min": 2, "max": 2}) == "2"
    assert f.format_nodes({"min": 1, "max": None}) == "1.."
    assert f.format_nodes_spec({"min": 0, "max": 3}) == "min=0 target=0 max=3"


def test_durations() -> None:
    assert [f.format_duration(s) for s in (300, 3600, 90, 86400 * 14)] == ["5m", "1h", "90s", "2w"]
    assert f.parse_duration("5m") == 300
    assert f.parse_duration("2h") == 7200
    assert f.parse_duration(600) == 600
    assert f.parse_duration("off") == -1
    assert f.parse_duration(None) is None
    assert f.format_retry({"on_events": ["no-capacity", "error"], "duration": 3600}) == "1h[no-capacity, error]"
    assert f.format_retry(None) == "off"


@pytest.mark.parametrize(
    ("delta", "expected"),
    [
        (timedelta(seconds=3), "now"),
        (timedelta(seconds=42), "42 sec ago"),
        (timedelta(seconds=90), "1 min ago"),
        (timedelta(minutes=3), "3 mins ago"),
        (timedelta(minutes=61), "1 hour ago"),
        (timedelta(hours=5), "5 hours ago"),
        (timedelta(days=1, hours=1), "yesterday"),
        (timedelta(days=3), "3 days ago"),
        (timedelta(days=8), "1 week ago"),
    ],
)
def test_pretty_date(delta: timedelta, expected: str) -> None:
    now = datetime(2026, 11, 29, 22, 0, tzinfo=timezone.utc)
    stamp = (now - delta).isoformat().replace("+00:00", "Z")
    assert f.pretty_date(stamp, now=now) == expected


@pytest.mark.parametrize(
    ("sub", "expected"),
    [
        ({"status": "done"}, "exited (0)"),
        (
            {"status": "failed", "termination_reason": "container_exited_with_error", "exit_status": 3},
            "exited (3)",
        ),
        ({"status": "failed", "termination_reason": "failed_to_start_due_to_no_capacity"}, "no capacity"),
        (
            {
                "status": "failed",
                "termination_reason": "failed_to_start_due_to_no_capacity",
                "termination_reason_message": "No matching fleet found. Possible reasons: ...",
            },
            "no fleets",
        ),
        ({"status": "failed", "termination_reason": "interrupted_by_no_capacity"}, "interrupted"),
        ({"status": "failed", "termination_reason": "instance_unreachable"}, "error"),
        ({"status": "terminated", "termination_reason": "terminated_by_user"}, "stopped"),
        ({"status": "terminated", "termination_reason": "aborted_by_user"}, "aborted"),
        ({"status": "running"}, "running"),
        ({"status": "failed", "status_message": "from server"}, "from server"),
    ],
)
def test_job_status_text(sub: dict[str, Any], expected: str) -> None:
    assert f.job_status_text(sub) == expected


def test_run_status_text_uses_job_once_finished() -> None:
    sub = {"status": "failed", "termination_reason": "failed_to_start_due_to_no_capacity"}
    assert f.run_status_text({"status": "failed", "status_message": "failed", "latest_job_submission": sub}) == (
        "no capacity"
    )
    assert f.run_status_text({"status": "running", "status_message": "pulling"}) == "pulling"


def test_merged_profile() -> None:
    spec = {
        "profile": {"name": "default", "spot_policy": "auto"},
        "configuration": {"spot_policy": "spot", "idle_duration": "10m"},
    }
    merged = f.merged_profile(spec)
    assert merged["spot_policy"] == "spot"
    assert merged["creation_policy"] == "reuse-or-create"
    assert merged["idle_duration"] == "10m"
