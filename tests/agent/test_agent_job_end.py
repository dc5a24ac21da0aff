"""A job's end reaches the server in the logs poll that sees its last output: a poll made once the job's
process has exited waits (briefly) for the job to settle rather than answer ``running`` with the output and
leave the end to one more long poll. (That the host's last sandbox takes the bridge with it once its job is
seen finished is checked after every test of ``test_sandbox.py``.)"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from corral.agent import jobs
from corral.agent.job import Job
from corral.agent.jobs import JobRunner
from corral.agent.protocol import JobState, JobSubmission


def _running_job(runner: JobRunner, tmp_path: Path, exited: bool) -> Job:
    sub = JobSubmission("j1", "run", ["echo hi"])
    job_dir = tmp_path / "w" / "jobs" / "j1"
    job_dir.mkdir(parents=True)
    job = Job(str(job_dir), sub, JobState(job_id="j1", state="running"))
    job.logs.append("stdout", [b"hi\n"], time.time())
    job.proc = subprocess.Popen(["true"] if exited else ["sleep", "30"])
    if exited:
        job.proc.wait()
    runner._jobs["j1"] = job
    return job


def _settle_later(job: Job, delay: float) -> None:
    def settle() -> None:
        time.sleep(delay)
        with job.cond:
            job.state.state, job.state.exit_status, job.state.finished_at = "done", 0, time.time()
            job.cond.notify_all()

    threading.Thread(target=settle, daemon=True).start()


def test_a_poll_after_the_process_exited_answers_with_the_job_s_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a settle wait far longer than the settling's delay: a busy machine's late thread is not what is tested
    monkeypatch.setattr(jobs, "SETTLE_WAIT_S", 5.0)
    runner = JobRunner(str(tmp_path / "w"))
    job = _running_job(runner, tmp_path, exited=True)
    _settle_later(job, 0.15)
    started = time.monotonic()
    reply = runner.logs("j1", 0, 100, wait=10)
    assert reply.state.state == "done" and [e.message for e in reply.entries] == [b"hi\n"]
    assert time.monotonic() - started < 5.0  # the settling ended the wait, not the wait's bound


def test_a_poll_while_the_process_runs_answers_with_its_output_at_once(tmp_path: Path) -> None:
    runner = JobRunner(str(tmp_path / "w"))
    job = _running_job(runner, tmp_path, exited=False)
    try:
        started = time.monotonic()
        reply = runner.logs("j1", 0, 100, wait=10)
        assert reply.state.state == "running" and len(reply.entries) == 1
        assert time.monotonic() - started < 1.0
    finally:
        assert job.proc is not None
        job.proc.kill()
        job.proc.wait()


def test_the_settle_wait_never_outlasts_the_poll_s_own_wait(tmp_path: Path) -> None:
    runner = JobRunner(str(tmp_path / "w"))
    _running_job(runner, tmp_path, exited=True)  # never settles
    started = time.monotonic()
    reply = runner.logs("j1", 0, 100, wait=0.05)
    assert reply.state.state == "running" and time.monotonic() - started < 0.5
