"""Time limits as Slurm prints them and as corral asks for them (``parse``, ``batch.time_bound``, ``states``: pure),
on outputs captured from Slurm 22.05 (``tests/data/slurm/``: ``capture.py --time-limits``)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from corral.backends.slurm import batch, parse, states

DATA = Path(__file__).resolve().parent.parent / "data" / "slurm"


def _read(name: str) -> str:
    return (DATA / name).read_text()


def test_partition_limits_as_sinfo_prints_them() -> None:
    limits = {p.name: p.time_limit for p in parse.parse_sinfo(_read("sinfo-maxtime.txt"))[1]}
    assert limits == {"gpu": "2-00:00:00", "cpu": "1:00"}  # MaxTime=2880 and MaxTime=1 (minutes)
    assert parse.slurm_seconds(limits["cpu"]) == 60 and parse.slurm_seconds(limits["gpu"]) == 2 * 86400
    unlimited = {p.name: p.time_limit for p in parse.parse_sinfo(_read("sinfo-maxtime-unlimited.txt"))[1]}
    assert unlimited["gpu"] == "infinite" and parse.slurm_seconds(unlimited["gpu"]) is None
    idle = {p.name: p.time_limit for p in parse.parse_sinfo(_read("sinfo-idle.txt"))[1]}
    assert parse.slurm_seconds(idle["cpu"]) == 3600  # MaxTime=60


def test_a_jobs_limit_and_time_left() -> None:
    first = parse.parse_time_left(_read("squeue-time-left.txt"))  # --time=1 on cpu
    assert first == parse.JobTime("cpu", 60, 60, "1:00")
    second = parse.parse_time_left(_read("squeue-time-left.txt").splitlines()[1])  # --time=2-3 on gpu
    assert (second.partition, second.limit, second.left) == ("gpu", (2 * 24 + 3) * 3600, (2 * 24 + 3) * 3600)
    with pytest.raises(ValueError, match="expected 3 fields"):
        parse.parse_time_left("cpu|1:00\n")
    shown = parse.parse_scontrol_line(_read("scontrol-show-job.txt"))
    assert shown["TimeLimit"] == "00:01:00" and parse.slurm_seconds(shown["TimeLimit"]) == 60
    part = parse.parse_scontrol_line(_read("scontrol-show-partition.txt").splitlines()[0])
    assert part["MaxTime"] == "01:00:00" and parse.slurm_seconds(part["DefaultTime"]) is None  # NONE


def test_a_job_ended_at_its_limit() -> None:
    job = {j.id: j for j in parse.parse_squeue(_read("squeue-timeout.txt"))}["1"]
    assert (job.state, job.reason, job.time_limit) == ("TIMEOUT", "TimeLimit", "1:00")
    said = states.ended_message(job.id, job.state, "1:00, partition cpu's time limit")
    assert said == (
        "Slurm job 1 ended TIMEOUT: it reached its time limit (1:00, partition cpu's time limit) (an interruption)"
    )
    assert "time limit (an interruption)" in states.ended_message("1", "TIMEOUT")


@pytest.mark.parametrize(
    ("text", "printed", "seconds"),
    [
        ("5:07", True, 307), ("1:00:00", True, 3600), ("2-00:00:00", True, 172800), ("UNLIMITED", True, None),
        ("NOT_SET", True, None), ("30", False, 1800), ("2-12", False, 216000), ("2-12:30", False, 217800),
        ("1:2:3", False, 3723),
    ],
)  # fmt: skip
def test_slurm_times(text: str, printed: bool, seconds: int | None) -> None:
    assert parse.slurm_seconds(text, printed=printed) == seconds


@pytest.mark.parametrize(("text", "printed"), [("30", True), ("1h", False), ("", False), ("1:2:3:4", False)])
def test_not_slurm_times(text: str, printed: bool) -> None:
    with pytest.raises(ValueError, match="Slurm"):
        parse.slurm_seconds(text, printed=printed)


def test_slurm_time_formatting() -> None:
    assert [parse.format_slurm_time(s) for s in (0, 59, 60, 3600, 3661, 172800, -5)] == [
        "0:00", "0:59", "1:00", "1:00:00", "1:01:01", "2-00:00:00", "0:00",
    ]  # fmt: skip


def test_the_time_bound() -> None:
    bound = batch.time_bound
    # the run's max_duration, whole minutes rounded up, below the partition's limit
    assert bound(61, None, "cpu", "1:00:00") == batch.TimeBound(120, "2", "the run's max_duration")
    assert bound(60, "4:00:00", "cpu", "1:00:00") == batch.TimeBound(60, "1", "the run's max_duration")
    # never above the partition's
    assert bound(7200, None, "cpu", "1:00:00") == batch.TimeBound(3600, "60", "partition cpu's time limit")
    assert bound(7200, None, "cpu", "1:00") == batch.TimeBound(60, "1", "partition cpu's time limit")
    # the cluster's time_limit when the run has none (as written), capped by the partition's too
    assert bound(None, "30", "cpu", "1:00:00") == batch.TimeBound(1800, "30", "the cluster's time_limit")
    assert bound(0, "4:00:00", "cpu", "1:00:00") == batch.TimeBound(3600, "60", "partition cpu's time limit")
    assert bound(None, "UNLIMITED", "cpu", "infinite") == batch.TimeBound(None, "UNLIMITED", "the cluster's time_limit")
    assert bound(None, "UNLIMITED", "cpu", "1:00") == batch.TimeBound(60, "1", "partition cpu's time limit")
    # neither: no --time, the partition's applies
    assert bound(None, None, "cpu", "1:00:00") == batch.TimeBound(3600, None, "partition cpu's time limit")
    assert bound(None, None, "cpu", None) == batch.TimeBound(None, None, "partition cpu's time limit")
    assert bound(None, None, "cpu", "garbage") == batch.TimeBound(None, None, "partition cpu's time limit")
    assert batch.describe(bound(None, None, "cpu", "1:00:00")) == "1:00:00, partition cpu's time limit"
    assert batch.describe(bound(None, None, "cpu", None)) == "partition cpu's time limit: none"


def test_the_time_limit_in_the_batch_script() -> None:
    req = batch.BatchRequest(
        row_ids=("r1",), server_id="s", partitions=("cpu",), cpus=1, memory_mib=100, gpus=0, gpu_type=None,
        home="/home/u", agent_hash="0" * 64, max_duration=7200.0, partition_limit="1:00:00",
    )  # fmt: skip
    assert "--time=60" in batch.directives(req)
    assert not [d for d in batch.directives(req) if d.startswith("--signal")]


def test_the_server_ends_an_allocation_before_its_limit() -> None:
    assert states.end_margin(None) == 60 and states.end_margin(3600) == 60 and states.end_margin(60) == 30
    assert not states.ending(1000.0, None, None)
    assert not states.ending(1000.0, 1100.0, 3600) and states.ending(1040.0, 1100.0, 3600)
    assert not states.ending(1000.0, 1060.0, 60) and states.ending(1030.0, 1060.0, 60)


def test_messages_name_the_limit_and_the_end() -> None:
    ends = datetime(2026, 12, 6, 15, 4, 30, tzinfo=timezone.utc).timestamp()
    said = "1:00:00, partition cpu's time limit"
    assert states.running_message("42", "n1", ends, said) == (
        "Slurm job 42 on n1; ends by 2026-12-06 15:04 UTC (time limit 1:00:00, partition cpu's time limit)"
    )
    assert states.running_message("42", "n1", None, "partition cpu's time limit: none") == (
        "Slurm job 42 on n1; no time limit (partition cpu's time limit: none)"
    )
    assert states.ending_message("42", ends, said) == (
        "Slurm job 42 reaches its time limit (1:00:00, partition cpu's time limit) at 2026-12-06 15:04 UTC: "
        "ended before Slurm kills it (an interruption)"
    )
