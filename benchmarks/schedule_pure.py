#!/usr/bin/env python3
"""The pure scheduler alone: placements per second of ``schedule()`` on a generated snapshot.

Builds a snapshot of F fleets holding I instances in all (idle, ``blocks`` each, a mix of CPU and GPU
machines) and Q queued single-node jobs (a mix of CPU and GPU requests, a few priorities), then times
``schedule(snapshot, now)`` R times and prints the median pass, placements per second (jobs assigned or
reserved per second of a pass) and the plan's shape. No database, no server: the decision only.

Then the pass a drain makes most: the fleets full with what the first pass placed, the rest of the queue told
to wait by it (each job's status message that wait's), and one block freed by a job's end. It times
``schedule()`` and ``schedule_head()`` (the scheduling worker's pass over the queue's head,
``scheduler/head_pass.py``, given the queue's order as the worker keeps it) on that.

With ``--quotas`` the jobs come from three projects weighted 1:2:3 that share the fleets (exported by the
first), each with a ``quota.max`` of 40 % of the CPUs and GPUs: the pass orders them by fair share and
charges every placement against its project's quota (admissions per second with quotas on); in the drain's
pass each project holds what the first pass placed for it.

    python benchmarks/schedule_pure.py [--jobs 10000] [--instances 1000] [--fleets 50] [--blocks 4] [--repeat 5]
    python benchmarks/schedule_pure.py --quotas
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from corral.domain.quotas import Limits, limits_from_doc
from corral.domain.resources import Gpu, GpuSpec, InstanceResources, Range, Requirements
from corral.scheduler.fair_share import ShareBook
from corral.scheduler.head_pass import schedule_head
from corral.scheduler.queue_order import QueueOrder
from corral.scheduler.schedule import schedule
from corral.scheduler.types import (
    Assign,
    FairShare,
    FleetSlot,
    InstanceSlot,
    Offer,
    Plan,
    ProjectQuota,
    QueuedJob,
    Reserve,
    Snapshot,
    Wait,
    WaitPolicy,
)

CPU_BOX = InstanceResources(cpus=32, memory_mib=131072, disk_size_mib=500_000, cpu_arch="x86")
GPU_BOX = InstanceResources(
    cpus=64, memory_mib=524288, gpus=(Gpu("H100", 81_559),) * 8, disk_size_mib=2_000_000, cpu_arch="x86"
)
CPU_JOB = Requirements(cpu_count=Range(2, None), memory=Range(4.0, None), disk=Range(10.0, None))
GPU_JOB = Requirements(
    cpu_count=Range(4, None), memory=Range(16.0, None), disk=Range(10.0, None), gpu=GpuSpec(count=Range(1, 2))
)


PROJECTS = ("p", "q", "r")


def build(jobs: int, instances: int, fleets: int, blocks: int, seed: int = 7, quotas: bool = False) -> Snapshot:
    rng = random.Random(seed)
    per_fleet = max(1, instances // fleets)
    fleet_slots = []
    for f in range(fleets):
        box = GPU_BOX if f % 5 == 0 else CPU_BOX
        offer = Offer("ssh", "ssh", "remote", 0.0, box)
        insts = tuple(
            InstanceSlot(
                id=f"f{f}-i{i}", fleet_id=f"f{f}", name=f"fleet-{f}-{i}", instance_num=i, status="idle",
                resources=box, total_blocks=blocks, busy_blocks=0, backend="ssh",
            )
            for i in range(per_fleet)
        )  # fmt: skip
        fleet_slots.append(
            FleetSlot(
                id=f"f{f}", project_id="p", name=f"fleet-{f}", nodes_min=per_fleet, nodes_max=per_fleet,
                blocks=blocks, placement="any", offers=(offer,), instances=insts, project_name="main",
                importer_project_ids=frozenset(PROJECTS[1:]) if quotas else frozenset(),
            )
        )  # fmt: skip
    owners = [rng.choice(PROJECTS) if quotas else "p" for _ in range(jobs)]
    queue = tuple(
        QueuedJob(
            id=f"j{n}", run_id=f"r{n}", project_id=owners[n], run_name=f"run-{n}", job_num=0,
            priority=rng.choice((0, 0, 0, 10, 50)), submitted_at=float(n),
            requirements=GPU_JOB if rng.random() < 0.2 else CPU_JOB, fleet_names=None,
            creation_policy="reuse-or-create", wait=WaitPolicy(True),
            project_name="main" if owners[n] == "p" else owners[n],
        )
        for n in range(jobs)
    )  # fmt: skip
    if not quotas:
        return Snapshot(fleets=tuple(fleet_slots), queue=queue)
    cpus = sum(i.resources.cpus for f in fleet_slots for i in f.instances if i.resources is not None)
    gpus = sum(len(i.resources.gpus) for f in fleet_slots for i in f.instances if i.resources is not None)
    cap = limits_from_doc({"cpu": int(cpus * 0.4), "gpu": int(gpus * 0.4)})
    return Snapshot(
        fleets=tuple(fleet_slots),
        queue=queue,
        quotas={p: ProjectQuota(cap, {}, frozenset(), p) for p in PROJECTS},
        shares={p: FairShare(float(w), Limits(), {}) for p, w in zip(PROJECTS, (1, 2, 3), strict=True)},
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--instances", type=int, default=1_000)
    ap.add_argument("--fleets", type=int, default=50)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="print cProfile's top functions of one pass")
    ap.add_argument("--quotas", action="store_true", help="three projects with quota.max and fair share")
    a = ap.parse_args()
    snap = build(a.jobs, a.instances, a.fleets, a.blocks, quotas=a.quotas)
    if a.profile:
        import cProfile
        import pstats

        cProfile.runctx("schedule(snap, 0.0)", globals(), {"snap": snap}, "/dev/null")
        prof = cProfile.Profile()
        prof.runcall(schedule, snap, 0.0)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    jobs = {j.id: j for j in snap.queue}
    times, plan = [], None
    for _ in range(a.repeat):
        t = time.perf_counter()
        plan = schedule(snap, 0.0)
        times.append(time.perf_counter() - t)
    assert plan is not None
    kinds = Counter(type(d).__name__ for g in plan.gangs for d in g.decisions)
    placed = sum(1 for g in plan.gangs for d in g.decisions if isinstance(d, (Assign, Reserve)))
    med = statistics.median(times)
    slots = sum(len(f.instances) for f in snap.fleets) * a.blocks
    print(f"snapshot: {a.jobs} queued jobs, {sum(len(f.instances) for f in snap.fleets)} instances in "
          f"{a.fleets} fleets, {a.blocks} blocks each ({slots} block slots)")  # fmt: skip
    print(f"schedule(): median {med * 1000:.0f} ms per pass (min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f})")
    print(f"decisions: {dict(kinds)}")
    if a.quotas:
        by = Counter(j.project_id for j in snap.queue)
        got = Counter(
            jobs[d.job_id].project_id
            for g in plan.gangs
            for d in g.decisions
            if isinstance(d, (Assign, Reserve)) and d.job_id is not None
        )
        print(f"quotas and fair share on (weights 1:2:3, quota.max 40 % each): placed per project {dict(got)}")
        print(f"  of queued per project {dict(by)}")
    print(f"placements per second: {placed / med:,.0f} ({placed} placed per pass)")
    print(f"jobs decided per second: {a.jobs / med:,.0f}")
    drain(snap, plan, a.repeat)


def drain(snap: Snapshot, plan: Plan, repeat: int) -> None:
    """The pass after one job ended, the fleets otherwise full and the rest of the queue told to wait."""
    told_to_wait = {d.job_id for g in plan.gangs for d in g.decisions if isinstance(d, Wait)}
    waiting = tuple(j for j in snap.queue if j.id in told_to_wait)
    fleets = tuple(
        replace(f, instances=tuple(replace(i, busy_blocks=i.total_blocks, status="busy") for i in f.instances))
        for f in snap.fleets
    )
    n = 1 if len(fleets) > 1 else 0  # a CPU fleet where there is one: an instance has a block free again
    freed = replace(fleets[n].instances[0], busy_blocks=fleets[n].instances[0].total_blocks - 1)
    fleets = (*fleets[:n], replace(fleets[n], instances=(freed, *fleets[n].instances[1:])), *fleets[n + 1 :])
    after = replace(snap, fleets=fleets, queue=waiting)
    if snap.shares:  # each project holds what the first pass placed for it
        book = ShareBook(snap)
        on: dict[str, set[str]] = {}
        for g in plan.gangs:
            book.take(g.project_id, g.decisions)
            on.setdefault(g.project_id, set()).update(d.instance_id for d in g.decisions if isinstance(d, Assign))
        used = {p: dict(book.used.get(p, {})) for p in snap.shares}
        after = replace(
            after,
            quotas={p: replace(q, used=used[p], instance_ids=frozenset(on.get(p, ()))) for p, q in snap.quotas.items()},
            shares={p: replace(s, used=used[p], instance_ids=frozenset(on.get(p, ()))) for p, s in snap.shares.items()},
        )
    # every waiting job's status message is the wait the pass before this one gave it, as the commit writes it
    said = {d.job_id: d.message for g in schedule(after, 0.0).gangs for d in g.decisions if isinstance(d, Wait)}
    after = replace(after, queue=tuple(replace(j, status_message=said.get(j.id)) for j in waiting))
    order = QueueOrder(after.queue)  # kept by the worker across passes, job by job
    whole, head = [], []
    for _ in range(repeat):
        t = time.perf_counter()
        schedule(after, 0.0)
        whole.append(time.perf_counter() - t)
        t = time.perf_counter()
        took = schedule_head(after, 0.0, set(), order)  # no job pending: every one was told to wait
        head.append(time.perf_counter() - t)
    if took is None:  # the worker then makes a whole pass
        print(f"a drain's pass: {len(waiting)} queued behind full fleets: schedule_head() declines, a whole pass "
              f"is made: schedule() {statistics.median(whole) * 1000:.1f} ms")  # fmt: skip
        return
    got = [d for g in took.gangs for d in g.decisions if isinstance(d, Assign)]
    w, h = statistics.median(whole), statistics.median(head)
    policies = " (quotas and fair share on)" if snap.shares else ""
    print(f"a drain's pass{policies}: {len(waiting)} queued behind full fleets, one block freed: "
          f"schedule() {w * 1000:.1f} ms, "
          f"schedule_head() {h * 1000:.2f} ms ({w / h:.1f}x), placing {len(got)} job")  # fmt: skip


if __name__ == "__main__":
    main()
