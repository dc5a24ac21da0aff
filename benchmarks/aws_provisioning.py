#!/usr/bin/env python3
"""AWS backend against moto: provisioning throughput and EC2 API calls per placed job.

Starts moto's EC2 server on loopback, a VPC whose subnet is a fake-host network (``tests/fakehosts.py``:
one network namespace with sshd per instance, at its private IP, its UserData run in it) and a corral
server in-process with an ``aws`` backend. Then:

1. a fleet with ``nodes: N`` (default 20): the time until all N instances are ready (idle, their agents
   answering), and the EC2 calls that took, by operation;
2. M runs (default 20, ``echo ok``) placed on those instances: the EC2 calls per placed job (none are
   needed: placement reuses the instances).

Needs root (network namespaces). Figures, not assertions::

    sudo .venv/bin/python benchmarks/aws_provisioning.py [--instances 20] [--jobs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "aws")]

CONFIG = """
projects:
  - name: main
    backends:
      - type: aws
        creds: {type: access_key, access_key: AKIABENCH, secret_key: bench}
        regions: [us-east-1]
        vpc_name: corral-test
        public_ips: false
"""


async def main_async(n: int, jobs: int) -> None:
    import logging
    import os

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs every request otherwise

    from moto_harness import Hypervisor, MotoEC2

    from fakehosts import FakeHosts
    from server_harness import make_settings, running_server, wait_for

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        moto = MotoEC2(base).start()
        os.environ["AWS_ENDPOINT_URL"] = moto.url
        os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
        hosts = FakeHosts({}, base / "hosts").start()
        _vpc, zone_a, _zone_b = moto.make_vpc(hosts.subnet)
        moto.client().delete_subnet(SubnetId=zone_a)  # one zone: the fake hosts' network
        hv = Hypervisor(moto, hosts).start()
        try:
            settings = make_settings(base, provisioning_timeout=120.0, safety_net_interval=2.0)
            settings.server_dir.mkdir(parents=True)
            (settings.server_dir / "config.yml").write_text(CONFIG)
            async with running_server(settings) as s, s.client() as c:
                compute = s.ctx.computes["aws"]
                fleet = {"type": "fleet", "name": "bench", "nodes": n, "backends": ["aws"], "resources": {"cpu": "2.."}}
                t0 = time.monotonic()
                r = await c.post(
                    "/api/project/main/fleets/apply",
                    json={"plan": {"spec": {"configuration": fleet, "profile": {}}}, "force": True},
                )
                assert r.status_code == 200, r.text

                async def ready() -> bool:
                    got = (await c.post("/api/project/main/fleets/get", json={"name": "bench"})).json()
                    return sum(1 for i in got["instances"] if i["status"] == "idle") == n

                await wait_for(ready, timeout=600, interval=0.2)
                took = time.monotonic() - t0
                calls = dict(compute.session.calls)
                total = sum(calls.values())
                print(f"{n} instances to ready: {took:.1f} s ({n / took:.2f} instances/s)")
                print(f"EC2 calls for them: {total} ({total / n:.1f} per instance): {sorted(calls.items())}")
                before = sum(compute.session.calls.values())
                t1 = time.monotonic()
                for i in range(jobs):
                    conf = {"type": "task", "name": f"b-{i}", "commands": ["echo ok"], "fleets": ["bench"],
                            "resources": {"cpu": "2.."}}  # fmt: skip
                    r = await c.post(
                        "/api/project/main/runs/apply",
                        json={"force": True, "plan": {"run_spec": {"configuration": conf}}},
                    )
                    assert r.status_code == 200, r.text
                for i in range(jobs):

                    async def done(name: str = f"b-{i}") -> bool:
                        got = (await c.post("/api/project/main/runs/get", json={"run_name": name})).json()
                        return got["status"] in ("done", "failed", "terminated")

                    await wait_for(done, timeout=300, interval=0.2)
                placed = sum(compute.session.calls.values()) - before
                print(
                    f"{jobs} jobs on the fleet: {time.monotonic() - t1:.1f} s, "
                    f"EC2 calls: {placed} ({placed / jobs:.2f} per placed job)"
                )
                print(f"peak instances pending/running/shutting-down in EC2: {hv.peak}")
                await c.post("/api/project/main/fleets/delete", json={"names": ["bench"]})

                async def gone() -> bool:
                    return not moto.instances(instance_state_name=["pending", "running", "shutting-down"])

                await wait_for(gone, timeout=300)
        finally:
            hv.stop()
            hosts.stop()
            moto.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=20)
    a = ap.parse_args()
    asyncio.run(main_async(a.instances, a.jobs))


if __name__ == "__main__":
    main()
