#!/usr/bin/env python3
"""Slurm submission: how long a run takes from `runs/apply` to running on an idle partition, and how often corral
asks Slurm while runs queue.

Starts the test suite's real Slurm cluster (Debian's slurm-wlm on fake hosts: `tests/slurm_harness.py`; needs root
and the Slurm packages) and an in-process corral server whose `config.yml` names it, then:

- submission -> running: N runs one after another (`sleep 1`) on an idle partition; per run, the time from the
  apply's answer to the run's `running` (sbatch, Slurm starting the allocation, the agent up, the job handed
  to it); p50 and p90;
- Slurm calls with 100 runs queued: 100 runs (`sleep 600`) against a fleet `nodes: 0..3` (3 allocations run, 97
  wait in corral's queue); after a minute, the commands run on the login node in the last minute, by name
  (`SlurmCluster.calls_per_minute`).

Figures, not assertions.

    sudo .venv/bin/python benchmarks/slurm_submit.py [--runs 10] [--queued 100]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from server_harness import make_settings, running_server
from slurm_harness import CLUSTER_NAME, USER, SlurmTestCluster

SMALL = {"cpu": "1..", "memory": "0.1GB.."}


def _config(slurm: SlurmTestCluster, tmp: Path) -> None:
    key = tmp / "cluster_key"
    key.write_text(slurm.key_pem())
    key.chmod(0o600)
    cluster = {"name": CLUSTER_NAME, "hostname": slurm.login_ip, "user": USER, "private_key": {"path": str(key)}}
    cluster["cpu_partitions"] = ["cpu"]
    config = {"projects": [{"name": "main", "backends": [{"type": "slurm", "clusters": [cluster]}]}]}
    (tmp / "server").mkdir(parents=True, exist_ok=True)
    (tmp / "server" / "config.yml").write_text(yaml.safe_dump(config))


async def _apply(c: httpx.AsyncClient, name: str, commands: list[str]) -> None:
    conf = {"type": "task", "name": name, "commands": commands, "fleets": ["hpc"], "resources": SMALL}
    r = await c.post(
        "/api/project/main/runs/apply", json={"force": True, "plan": {"run_spec": {"configuration": conf}}}
    )
    r.raise_for_status()


async def _status(c: httpx.AsyncClient, name: str) -> str:
    r = await c.post("/api/project/main/runs/get", json={"run_name": name})
    return str(r.json()["status"])


async def _until(c: httpx.AsyncClient, name: str, statuses: tuple[str, ...], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while await _status(c, name) not in statuses:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} not {statuses} within {timeout}s")
        await asyncio.sleep(0.05)


async def measure(slurm: SlurmTestCluster, tmp: Path, runs: int, queued: int) -> dict[str, Any]:
    _config(slurm, tmp)
    settings = make_settings(tmp, instance_check_interval=1.0, provisioning_timeout=120.0)
    async with running_server(settings) as server, server.client() as c:
        fleet = {"type": "fleet", "name": "hpc", "nodes": "0..3", "backends": ["slurm"]}
        body = {"force": False, "plan": {"spec": {"configuration": fleet, "profile": {}}}}
        (await c.post("/api/project/main/fleets/apply", json=body)).raise_for_status()
        waits = []
        for i in range(runs):
            t0 = time.monotonic()
            await _apply(c, f"one-{i}", ["sleep 1"])
            await _until(c, f"one-{i}", ("running", "done"))
            waits.append(time.monotonic() - t0)
            await _until(c, f"one-{i}", ("done", "failed", "terminated"))
        names = [f"queued-{i}" for i in range(queued)]
        await asyncio.gather(*(_apply(c, n, ["sleep 600"]) for n in names))
        await asyncio.sleep(70)
        calls: dict[str, float] = {}
        for cluster in server.ctx.slurm.clusters():
            for name, count in cluster.calls_per_minute().items():
                calls[name] = calls.get(name, 0.0) + count
        r = await c.post("/api/project/main/runs/stop", json={"runs_names": names, "abort": True})
        r.raise_for_status()
    waits.sort()
    return {
        "p50": statistics.median(waits),
        "p90": waits[min(len(waits) - 1, int(len(waits) * 0.9))],
        "waits": waits,
        "calls": calls,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--queued", type=int, default=100)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root: the test cluster runs in network namespaces")
    with tempfile.TemporaryDirectory(prefix="slurm-bench-") as d:
        slurm = SlurmTestCluster(Path(d) / "cluster").start()
        try:
            out = asyncio.run(measure(slurm, Path(d), args.runs, args.queued))
        finally:
            slurm.stop()
    print(f"load: {os.getloadavg()[0]:.2f} (1-min)")
    print(
        f"submission -> running on an idle partition ({args.runs} runs): p50 {out['p50']:.2f} s, p90 {out['p90']:.2f} s"
    )
    print("  each: " + " ".join(f"{w:.2f}" for w in out["waits"]))
    print(f"Slurm commands in the last minute with {args.queued} runs queued (3 running):")
    for name, count in sorted(out["calls"].items()):
        print(f"  {name}: {count:.0f}/min")


if __name__ == "__main__":
    main()
