"""The agent's sampler: a job's cgroup (v2 and v1 files) or its process tree, GPU values only for a job given
GPUs (one tool call per pass for all jobs), samples after a cursor, and bad samples dropped by the protocol
rather than failing the reply."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from corral.agent import metrics
from corral.agent.job import Job
from corral.agent.protocol import JobState, JobSubmission, LogsReply


def _job(tmp: Path, job_id: str, pid: int) -> Job:
    (tmp / job_id).mkdir()
    return Job(str(tmp / job_id), JobSubmission(job_id, "r", ["true"]), JobState(job_id, "running", pid=pid))


def test_cgroup_files_v2_and_v1(tmp_path: Path) -> None:
    v2 = tmp_path / "job.scope"
    v2.mkdir()
    (v2 / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    (v2 / "memory.current").write_text("1048576\n")
    (v2 / "memory.stat").write_text("anon 100\ninactive_file 48576\n")
    assert metrics.read_cgroup(("cgroup2", str(v2))) == (2_500_000, 1_048_576, 1_000_000)
    cpu, mem = tmp_path / "cpuacct" / "job", tmp_path / "memory" / "job"
    cpu.mkdir(parents=True)
    mem.mkdir(parents=True)
    (cpu / "cpuacct.usage").write_text("3000000000\n")
    (mem / "memory.usage_in_bytes").write_text("2000\n")
    (mem / "memory.stat").write_text("total_inactive_file 500\n")
    assert metrics.read_cgroup(("cgroup1", str(cpu), str(mem))) == (3_000_000, 2000, 1500)
    assert metrics.read_cgroup(("cgroup2", str(tmp_path / "gone"))) is None


def test_tool_output_parsers() -> None:
    assert metrics.parse_nvidia("0, 1024, 50\n1, [N/A], 3\n") == {0: (1024 * 2**20, 50)}
    amd = "gpu,gfx,vram_used,vram_total\n0,93,2048,196592\n"
    assert metrics.parse_amd(amd) == {0: (2048 * 2**20, 93)}
    assert metrics.parse_amd("nonsense\n") == {}


def test_process_tree_jobs_and_gpus_only_where_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def fake_run(argv: list[str]) -> str:
        calls.append(argv)
        return "0, 100, 10\n1, 200, 20\n"

    monkeypatch.setattr(metrics, "_run", fake_run)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        jobs = [_job(tmp_path, "busy", busy.pid), _job(tmp_path, "idle", idle.pid)]
        given: dict[str, Any] = {"busy": ([1], "nvidia"), "idle": ([], "")}
        s = metrics.Sampler(lambda: jobs, lambda j: j.state.pid, lambda j: given[j.sub.job_id], interval=0)
        assert s.sample_once(now=100.0) == 2
        assert s.sample_once(now=101.0) == 2
        assert len(calls) == 2  # one nvidia-smi per pass for every job of the host
        first, second = s.since("busy", 0)
        assert first.timestamp_micro == 100_000_000 and second.cpu_usage_micro >= first.cpu_usage_micro
        assert second.memory_usage_bytes > 0 and second.gpus[0].gpu_util_percent == 20  # host GPU 1 only
        assert len(second.gpus) == 1 and s.since("idle", 0)[0].gpus == ()
        assert s.since("busy", 100_000_000) == [second]
        s.forget("busy")
        assert s.since("busy", 0) == []
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()


def test_bad_samples_are_dropped_not_fatal() -> None:
    state = JobState("j", "running").to_dict()
    good = {"timestamp_micro": 1, "cpu_usage_micro": 2, "memory_usage_bytes": 3, "memory_working_set_bytes": 3}
    bad = {**good, "cpu_usage_micro": "lots"}
    reply = LogsReply.from_dict({"entries": [], "next_offset": 0, "state": state, "metrics": [good, bad, 7]})
    assert [m.cpu_usage_micro for m in reply.metrics] == [2]
    assert len(reply.metrics_rejected) == 2 and "cpu_usage_micro" in reply.metrics_rejected[0]
    assert LogsReply.from_dict(reply.to_dict()).metrics == reply.metrics
