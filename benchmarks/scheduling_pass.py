#!/usr/bin/env python3
"""One scheduling pass over a backlog: what the scheduler worker costs each time it is woken while a queue
of short jobs waits for a busy fleet (in a drain, a pass runs for every job that ends).

An in-process server (SQLite, the local backend) with a fleet of 4 local instances, each held by a long job,
and ``--queued`` trivial runs waiting behind them. Then the worker's own pass (load the queue and the fleets,
decide, commit) is run ``--passes`` times on the loop with nothing else to do, and timed: the pass as a
whole (CPU and wall), a fresh worker's first pass (every queued job read and taken: a restart), and with
``--profile`` the functions it spends its time in. Figures, not assertions.

With ``--hosts N`` the fleets are SSH fleets of N hosts (4 fleets; the background workers off, so no host is
reached: each host's row is written as its bootstrap would leave it, 2 blocks, both held), the queued runs ask
for any of them, and before each timed pass one block of a random host is given back, as a job's end gives it
back: each pass then places one job, as in a drain over that many hosts.

With ``--quotas`` (and ``--hosts``) the project has a scheduling policy, a ``quota.max`` of as many instances as
there are hosts (never reached): fair sharing is then on, and each pass takes the queue in fair-share order.

With ``--guard SECONDS`` the server's starvation guard (``CORRAL_STARVATION_GUARD``, 300 s by default) is that
long; ``--guard 0`` puts every queued job past it at once, as a backlog is once its oldest jobs have waited five
minutes: each waiting job past it holds the fleets it could use for itself.

With ``--arrivals K`` (and ``--hosts``) K runs are applied before each timed pass, as clients keep applying
while a backlog drains: the pass reads those K jobs first (their rows, with their scheduling facts).

    python benchmarks/scheduling_pass.py [--queued 400] [--passes 50] [--profile] [--hosts 2000 [--quotas]]
                                         [--guard SECONDS] [--arrivals K]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.in_process import InProcess, in_process_server

RES = {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."}


def _run_body(commands: list[str], fleets: list[str] | None = None) -> dict[str, object]:
    conf = {"type": "task", "commands": commands, "resources": RES, "fleets": fleets or ["busy"]}
    return {"force": False, "plan": {"run_spec": {"configuration": conf}}}


async def _instances(c: httpx.AsyncClient, status: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while sum(i["status"] == status for i in (await c.post("/api/instances/list", json={})).json()) < 4:
        if time.monotonic() > deadline:
            raise SystemExit(f"the fleet's 4 instances did not become {status} in {timeout:.0f} s")
        await asyncio.sleep(0.1)


HOST_FLEETS = [f"hosts-{k}" for k in range(4)]


async def _ssh_fleets(srv: InProcess, c: httpx.AsyncClient, hosts: int) -> list[str]:
    """``hosts`` SSH hosts in 4 fleets, each host's row as its bootstrap leaves it (2 blocks), both blocks held."""
    import asyncssh
    import sqlalchemy as sa

    from corral.domain.resources import InstanceResources
    from corral.scheduler.codec import offer_to_json
    from corral.scheduler.types import Offer
    from corral.store.tables import instances

    key = asyncssh.generate_private_key("ssh-ed25519")
    pair = {"public": key.export_public_key().decode().strip(), "private": key.export_private_key().decode()}
    for k, name in enumerate(HOST_FLEETS):
        addresses = [f"10.{n // 250}.{n % 250}.1" for n in range(k, hosts, len(HOST_FLEETS))]
        ssh = {"user": "u", "ssh_key": pair, "hosts": [{"hostname": h, "blocks": 2} for h in addresses]}
        conf = {"type": "fleet", "name": name, "ssh_config": ssh}
        body = {"force": True, "plan": {"spec": {"configuration": conf, "profile": {}}}}
        (await c.post("/api/project/main/fleets/apply", json=body)).raise_for_status()
    resources = InstanceResources(cpus=2, memory_mib=8192, disk_size_mib=100_000)
    offer = orjson_dumps(offer_to_json(Offer("ssh", "ssh", "remote", 0.0, resources)))
    async with srv.prepared.ctx.db.write() as conn:
        ids = list((await conn.execute(sa.select(instances.c.id).where(instances.c.backend == "ssh"))).scalars())
        await conn.execute(
            sa.update(instances)
            .where(instances.c.backend == "ssh")
            .values(status="busy", offer=offer, total_blocks=2, busy_blocks=2, started_at=time.time())
        )
    return ids


def orjson_dumps(value: object) -> str:
    import orjson

    return orjson.dumps(value).decode()


async def _free_a_block(srv: InProcess, ids: list[str]) -> None:
    """A job's end on a random host, as the store records it: one of its blocks given back."""
    import sqlalchemy as sa

    from corral.store.tables import instances

    async with srv.prepared.ctx.db.write() as conn:
        await conn.execute(
            sa.update(instances).where(instances.c.id == random.choice(ids)).values(busy_blocks=1, status="busy")
        )


async def main_hosts(
    hosts: int, queued: int, passes: int, profile: bool, quotas: bool, guard: float, arrivals: int
) -> None:
    from corral.workers.scheduling import Scheduling

    async with in_process_server("corral-bench-pass-", background_processing=False, starvation_guard=guard) as srv:
        headers = {"Authorization": f"Bearer {srv.token}"}
        async with httpx.AsyncClient(base_url=srv.url, headers=headers, timeout=60) as c:
            ids = await _ssh_fleets(srv, c, hosts)
            if quotas:  # a policy turns fair sharing on; a max of every host is never reached
                body = {"quota": {"max": {"instances": hosts}}}
                (await c.post("/api/projects/main/quotas/set", json=body)).raise_for_status()
            for _ in range(queued + passes):
                body = _run_body(["echo ok"], HOST_FLEETS)
                (await c.post("/api/project/main/runs/apply", json=body)).raise_for_status()
            worker = Scheduling(srv.prepared.ctx)
            for _ in range(3):
                await worker.pass_once()
            first = []
            for _ in range(3):
                c0 = time.process_time()
                await Scheduling(srv.prepared.ctx).pass_once()
                first.append(time.process_time() - c0)
            cpu, wall, placed = [], [], 0
            prof = cProfile.Profile() if profile else None
            for _ in range(passes):
                await _free_a_block(srv, ids)
                for _ in range(arrivals):  # runs applied since the last pass: the pass reads them first
                    body = _run_body(["echo ok"], HOST_FLEETS)
                    (await c.post("/api/project/main/runs/apply", json=body)).raise_for_status()
                c0, w0 = time.process_time(), time.perf_counter()
                if prof is not None:
                    prof.enable()
                result = await worker.pass_once()
                if prof is not None:
                    prof.disable()
                cpu.append(time.process_time() - c0)
                wall.append(time.perf_counter() - w0)
                placed += len(result.assigned)
    policy = (", a quota (fair share on)" if quotas else "") + f", starvation guard {guard:g} s"
    policy += f", {arrivals} runs applied before each pass" if arrivals else ""
    report(f"{hosts} SSH hosts in 4 fleets, every block held, {queued} jobs queued{policy}", cpu, wall, first, prof)
    print(f"  jobs placed: {placed} in {passes} passes (one block freed before each); load {os.getloadavg()}")


def report(what: str, cpu: list[float], wall: list[float], first: list[float], prof: cProfile.Profile | None) -> None:
    ms = 1000
    print(f"one scheduling pass, {what} ({len(cpu)} passes):")
    print(
        f"  CPU median {statistics.median(cpu) * ms:.2f} ms (min {min(cpu) * ms:.2f}), "
        f"wall median {statistics.median(wall) * ms:.2f} ms"
    )
    print(
        "  a fresh worker's first pass (reads and takes every queued job): "
        f"CPU median {statistics.median(first) * ms:.2f} ms"
    )
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(40)
        print(out.getvalue())


async def main_async(queued: int, passes: int, profile: bool, guard: float) -> None:
    from corral.workers.scheduling import Scheduling

    # room for 4 instances
    overrides = {"local_max_instances": 8, "local_cpus": 16, "local_memory_mib": 128 * 1024, "starvation_guard": guard}
    async with in_process_server("corral-bench-pass-", **overrides) as srv:
        headers = {"Authorization": f"Bearer {srv.token}"}
        async with httpx.AsyncClient(base_url=srv.url, headers=headers, timeout=60) as c:
            fleet = {"type": "fleet", "name": "busy", "nodes": 4, "resources": RES}
            spec = {"configuration": fleet, "profile": {}}
            body = {"force": True, "plan": {"spec": spec}}
            (await c.post("/api/project/main/fleets/apply", json=body)).raise_for_status()
            await _instances(c, "idle")
            for _ in range(4):
                (await c.post("/api/project/main/runs/apply", json=_run_body(["sleep 600"]))).raise_for_status()
            await _instances(c, "busy")
            for _ in range(queued):
                (await c.post("/api/project/main/runs/apply", json=_run_body(["echo ok"]))).raise_for_status()
            worker = Scheduling(srv.prepared.ctx)
            for _ in range(3):  # the queue's documents parsed once, the waits' messages written
                await worker.pass_once()
            await asyncio.sleep(2.0)  # the server's own passes after the submissions are over
            first = []  # a worker's first pass (a restart, a new replica): every queued job is read and taken
            for _ in range(max(3, passes // 10)):
                c0 = time.process_time()
                await Scheduling(srv.prepared.ctx).pass_once()
                first.append(time.process_time() - c0)
            cpu, wall = [], []
            prof = cProfile.Profile() if profile else None
            for _ in range(passes):
                c0, w0 = time.process_time(), time.perf_counter()
                if prof is not None:
                    prof.enable()
                await worker.pass_once()
                if prof is not None:
                    prof.disable()
                cpu.append(time.process_time() - c0)
                wall.append(time.perf_counter() - w0)
            await c.post("/api/project/main/runs/stop", json={"runs_names": [], "abort": True})
    report(f"{queued} jobs queued behind a busy fleet of 4, starvation guard {guard:g} s", cpu, wall, first, prof)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queued", type=int, default=400)
    parser.add_argument("--passes", type=int, default=50)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--hosts", type=int, default=0, help="SSH hosts in 4 fleets instead of 4 local instances")
    parser.add_argument("--quotas", action="store_true", help="with --hosts: a project quota, so fair share is on")
    parser.add_argument(
        "--guard", type=float, default=300.0, help="the starvation guard in seconds (0: every queued job is past it)"
    )
    parser.add_argument("--arrivals", type=int, default=0, help="with --hosts: runs applied before each timed pass")
    args = parser.parse_args()
    if args.arrivals < 0:
        parser.error("--arrivals must be 0 or more")
    if args.arrivals and not args.hosts:
        parser.error("--arrivals needs --hosts")
    if args.guard < 0:
        parser.error("--guard must be 0 or more seconds")
    if args.hosts < 0:
        parser.error("--hosts must be 0 (4 local instances) or more")
    if args.quotas and not args.hosts:
        parser.error("--quotas needs --hosts")
    if args.hosts:
        asyncio.run(
            main_hosts(args.hosts, args.queued, args.passes, args.profile, args.quotas, args.guard, args.arrivals)
        )
    else:
        asyncio.run(main_async(args.queued, args.passes, args.profile, args.guard))


if __name__ == "__main__":
    main()
