#!/usr/bin/env python3
"""The agent's CPU cost of sampling: its sampler over N running jobs (process trees in ``/proc``, the host's
own processes around them), with and without a (fake) ``nvidia-smi`` call per pass, as CPU time per pass and
per job, and the share of one core at the default 2 s interval. Figures, not assertions.

    python benchmarks/metrics_agent_cpu.py [--jobs 1 10 50] [--passes 50]
"""

from __future__ import annotations

import argparse
import os
import resource
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from corral.agent import metrics
from corral.agent.job import Job
from corral.agent.protocol import JobState, JobSubmission


def cpu_seconds() -> float:
    """This process's CPU time and its reaped children's (a tool call runs as a child)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def measure(n: int, passes: int, with_gpus: bool, tmp: Path) -> tuple[float, int]:
    procs = [subprocess.Popen(["sh", "-c", "sleep 600 & sleep 600 & wait"], start_new_session=True) for _ in range(n)]
    try:
        time.sleep(0.3)
        jobs = []
        for k, p in enumerate(procs):
            d = tmp / f"j{n}-{k}-{with_gpus}"
            d.mkdir()
            jobs.append(Job(str(d), JobSubmission(f"j{k}", "r", ["x"]), JobState(f"j{k}", "running", pid=p.pid)))
        gpus = ([0], "nvidia") if with_gpus else ([], "")
        s = metrics.Sampler(lambda: jobs, lambda j: j.state.pid, lambda j: gpus, interval=0)
        s.sample_once()
        start = cpu_seconds()
        for _ in range(passes):
            s.sample_once()
        return (cpu_seconds() - start) / passes, len(os.listdir("/proc"))
    finally:
        for p in procs:
            os.killpg(p.pid, 9)
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, nargs="+", default=[1, 10, 50])
    ap.add_argument("--passes", type=int, default=50)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        smi = tmp / "bin" / "nvidia-smi"
        smi.parent.mkdir()
        smi.write_text("#!/bin/sh\necho '0, 1234, 56'\n")
        smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
        os.environ["PATH"] = f"{smi.parent}:{os.environ['PATH']}"
        print(f"python {sys.version.split()[0]}, load {os.getloadavg()[0]:.2f}")
        for with_gpus in (False, True):
            for n in a.jobs:
                per_pass, entries = measure(n, a.passes, with_gpus, tmp)
                share = per_pass / metrics.DEFAULT_INTERVAL * 100
                tool = "+ nvidia-smi" if with_gpus else "            "
                print(
                    f"{n:3d} jobs {tool}: {per_pass * 1000:7.2f} ms CPU per pass, {per_pass * 1000 / n:6.3f} ms/job;"
                    f" {share:5.2f} % of a core at 2 s ({entries} /proc entries)"
                )


if __name__ == "__main__":
    main()
