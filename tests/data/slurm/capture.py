"""Capture the outputs corral's Slurm parsers read, from the real test cluster (``tests/slurm_harness.py``).

Run as root from the repository's root: ``.venv/bin/python tests/data/slurm/capture.py``. It starts the cluster,
puts it in the states below, writes each command's output next to this file, and stops the cluster.
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


def main() -> None:
    cluster = SlurmTestCluster(pathlib.Path(tempfile.mkdtemp(prefix="slurm-capture-"))).start()
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
    for name, text in out.items():
        (HERE / name).write_text(text)
        print(f"== {name}\n{text}")


if __name__ == "__main__":
    main()
