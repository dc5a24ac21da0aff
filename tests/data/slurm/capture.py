"""Capture the outputs corral's Slurm parsers read, from the real test cluster (``tests/slurm_harness.py``).

Run as root from the repository's root: ``.venv/bin/python tests/data/slurm/capture.py``. It starts the cluster,
puts it in the states below, writes each command's output next to this file, and stops the cluster. With
``--time-limits`` it captures only the time limits' outputs (partitions' ``MaxTime``, a job's limit and time left,
a job ended at its limit), which take a minute and a half.
"""

from __future__ import annotations

import pathlib
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from slurm_harness import SlurmTestCluster  # noqa: E402

SINFO = "sinfo -h -N -o '%N|%o|%T|%P|%a|%l|%c|%m|%G'"
SQUEUE = "squeue -h -u hpc -t all -o '%i|%j|%T|%r|%N|%P|%l|%k'"
TIME_LEFT = "squeue -h -j {job} -o '%P|%l|%L'"


def time_limits(cluster: SlurmTestCluster) -> dict[str, str]:
    """Partitions with MaxTime 1 minute, 2 days and unlimited; a job's limit and time left; a job ended TIMEOUT."""
    out = {"scontrol-show-partition.txt": cluster.root("login", "scontrol show -o partition")}
    cluster.root("login", "scontrol update partitionname=cpu maxtime=1")
    cluster.root("login", "scontrol update partitionname=gpu maxtime=2880")
    out["sinfo-maxtime.txt"] = cluster.root("login", SINFO)
    cluster.root("login", "scontrol update partitionname=gpu maxtime=UNLIMITED")
    out["sinfo-maxtime-unlimited.txt"] = cluster.root("login", SINFO)
    job = cluster.as_user("sbatch --parsable -N1 -p cpu -o /dev/null --time=1 --wrap 'sleep 300'").strip()
    long = cluster.as_user("sbatch --parsable -N1 -p gpu -o /dev/null --time=2-3 --wrap 'sleep 300'").strip()
    time.sleep(3)
    out["squeue-time-left.txt"] = cluster.as_user(TIME_LEFT.format(job=job)) + cluster.as_user(
        TIME_LEFT.format(job=long)
    )
    out["scontrol-show-job.txt"] = cluster.as_user(f"scontrol show -o job {job}")
    deadline = time.monotonic() + 150
    while "TIMEOUT" not in cluster.as_user(SQUEUE) and time.monotonic() < deadline:
        time.sleep(2)
    out["squeue-timeout.txt"] = cluster.as_user(SQUEUE)
    cluster.as_user("scancel -u hpc")
    return out


def main() -> None:
    cluster = SlurmTestCluster(pathlib.Path(tempfile.mkdtemp(prefix="slurm-capture-"))).start()
    if "--time-limits" in sys.argv[1:]:
        try:
            out = time_limits(cluster)
        finally:
            cluster.stop()
        _write(out)
        return
    try:
        out = {
            "sinfo-idle.txt": cluster.root("login", SINFO),
            "scontrol-ping.txt": cluster.root("login", "scontrol ping"),
            "scontrol-show-node.txt": cluster.root("login", "scontrol show -o node"),
        }
        out["sbatch-parsable.txt"] = cluster.as_user("sbatch --parsable -N2 -p cpu -o /dev/null --wrap 'sleep 300'")
        cluster.as_user(
            "sbatch --parsable -N1 -p gpu --gres=gpu:1 -o /dev/null --comment=corral:s1:r2 --wrap 'sleep 300'"
        )
        cluster.as_user("sbatch --parsable -N4 -p cpu -o /dev/null --job-name=waits --wrap 'sleep 300'")
        cluster.as_user("sbatch --parsable -N1 -p cpu -w n1 -o /dev/null --job-name=pinned --wrap 'true'")
        cluster.drain("n3", "disk failure")
        cluster.root("login", "scontrol update nodename=n4 state=down reason=broken")
        time.sleep(2)
        out["sinfo-busy.txt"] = cluster.root("login", SINFO)
        out["squeue-busy.txt"] = cluster.as_user(SQUEUE)
        out["scontrol-show-node-busy.txt"] = cluster.root("login", "scontrol show -o node")
        cluster.as_user("scancel -u hpc")
        time.sleep(1)
        out["squeue-ended.txt"] = cluster.as_user(SQUEUE)
        # a DOWN node resumed is "idle*" (not responding) until slurmctld pings it again
        cluster.root("login", "scontrol update nodename=n4 state=resume")
        out["sinfo-not-responding.txt"] = cluster.root("login", SINFO)
        out["srun-gres-on-cpu.txt"] = cluster.hosts.exec(
            "login", "runuser -l hpc -c 'srun -p cpu --gres=gpu:1 --immediate=5 hostname'"
        ).stderr.decode()
        out["sinfo-version.txt"] = cluster.root("login", "sinfo -V")
    finally:
        cluster.stop()
    _write(out)


def _write(out: dict[str, str]) -> None:
    for name, text in out.items():
        (HERE / name).write_text(text)
        print(f"== {name}\n{text}")


if __name__ == "__main__":
    main()
