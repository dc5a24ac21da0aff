#!/usr/bin/env python3
"""The pure scheduler with quotas on, on a simulated clock: 64 GPUs (8 hosts x 8 H100, one block per GPU),
10,000 single-GPU jobs, as many from each of three projects weighted 1:2:3, each with a ``quota.max`` on GPUs.

Jobs arrive as a Poisson stream at about 1.2x (``--load``) what the GPUs can serve (log-normal durations, median 30
min), so every project stays backlogged. The loop runs ``schedule()`` at each event (an arrival or a job's
end), commits its assignments to the simulated hosts and advances the clock: no database, no real jobs.
It prints admissions per second of scheduler time (the pass alone, quotas on, against the same passes
with quotas off), the most each project ever held against its max (never above it), GPU utilisation and
waits per project.

With ``--fair`` the projects' weights (1:2:3) order the contended GPUs (fair share) and ``--max none``
drops the quotas: it then prints each project's share of the GPU-seconds in 1-hour windows (after the
first hour, while jobs arrive) against its entitlement (64 x w / 6 GPUs with every project backlogged:
``--load 2`` keeps each one's demand above it).

With ``--preempt`` (fair share on, no ``quota.max`` unless ``--max`` names one) the jobs have mixed
priorities (70 % at 0, 20 % at 20, 10 % at 90; those at 50 or below preemptible), the projects nominal
quotas of 11, 21 and 32 GPUs, and preemption is on (``scheduler.preemption.choose`` after each pass:
``min_priority_gap`` 10, ``min_runtime`` 10 min, ``grace_period`` 120 s, within a project and reclaim). A
victim holds its GPU through the grace period, then is requeued in its place with its whole duration again
(no checkpoint), and the GPU it frees is held for its preemptor (``scheduler.holds``). It prints the
preemptions, the GPU-hours they threw away (the victims' run time, grace included), waits per project and
priority, utilisation, and the share against entitlement in 1-hour windows. The backlog grows with the
jobs, and each pass also tries preemption: ``--preempt --jobs 2000`` takes a few minutes of CPU, the
full 10,000 much longer.

    python benchmarks/schedule_quotas.py [--jobs 10000] [--seed 7] [--max 16,24,32|none] [--fair] [--load 1.2]
    python benchmarks/schedule_quotas.py --preempt
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from corral.domain.quotas import Limits, QuotaPolicy, charge, limits_from_doc
from corral.domain.resources import Gpu, GpuSpec, InstanceResources, Range, Requirements
from corral.scheduler.holds import HOLD_FOR
from corral.scheduler.preemption import RECLAIM, RunningJob, Settings, choose
from corral.scheduler.schedule import schedule
from corral.scheduler.types import (
    Assign,
    FairShare,
    FleetSlot,
    Hold,
    InstanceSlot,
    ProjectQuota,
    QueuedJob,
    Snapshot,
    Wait,
    WaitPolicy,
)

HOST = InstanceResources(
    cpus=64, memory_mib=524288, gpus=(Gpu("H100", 81_559),) * 8, disk_size_mib=2_000_000, cpu_arch="x86"
)
ONE_GPU = Requirements(
    cpu_count=Range(1, None), memory=Range(1.0, None), disk=Range(1.0, None), gpu=GpuSpec(count=Range(1, 1))
)
PROJECTS = ("a", "b", "c")
NOMINAL = dict(zip(PROJECTS, (11, 21, 32), strict=True))
PRIORITIES = ((0, 0.7), (20, 0.2), (90, 0.1))
PREEMPTION = Settings(enabled=True, min_priority_gap=10, min_runtime=600.0, grace_period=120.0)
ONE_BLOCK = charge(["H100"] * 8, 64, 524288, 0.0, 1, 8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--max", default=None, help="each project's quota.max on GPUs, or none (default 16,24,32)")
    ap.add_argument("--fair", action="store_true", help="fair share by the weights 1:2:3")
    ap.add_argument("--load", type=float, default=1.2, help="arrivals against what the GPUs serve")
    ap.add_argument("--preempt", action="store_true", help="mixed priorities, nominal quotas, preemption on")
    a = ap.parse_args()
    if a.max is None:
        a.max = "none" if a.preempt else "16,24,32"
    a.fair = a.fair or a.preempt
    rng = random.Random(a.seed)
    weights = dict(zip(PROJECTS, (1.0, 2.0, 3.0), strict=True))
    no_max = a.max == "none"
    maxes = dict(zip(PROJECTS, (10**9,) * 3 if no_max else (int(x) for x in a.max.split(",")), strict=True))
    windows: dict[int, dict[str, float]] = {}
    hosts, gpus = 8, 8
    median_s = 1800.0
    mean_s = median_s * 1.0  # log-normal with sigma 1 has mean ~1.65x median; rate set from it below
    rate = a.load * hosts * gpus / (mean_s * 1.65)
    t = 0.0
    arrivals = []
    for n in range(a.jobs):
        t += rng.expovariate(rate)
        project = rng.choice(PROJECTS)  # as many jobs from each: the weights alone must make the 1:2:3
        duration = min(86_400.0, rng.lognormvariate(0, 1) * median_s)
        pick, priority = rng.random(), 0
        for level, p in PRIORITIES:
            priority = level
            if pick < p:
                break
            pick -= p
        arrivals.append((t, n, project, duration, priority if a.preempt else 0))

    busy: dict[str, int] = {f"h{h}": 0 for h in range(hosts)}
    running: list[tuple[float, str, str, str]] = []  # (ends at, job, host, project)
    ends: dict[str, float] = {}  # job -> when it ends (a preempted job ends sooner: older entries are stale)
    started: dict[str, tuple[float, str, int]] = {}  # job -> (started at, host, priority)
    victims: dict[str, str] = {}  # a preempted job still in its grace period -> its preemptor's run
    holds: list[Hold] = []
    policies = {
        p: QuotaPolicy(weight=weights[p], nominal=limits_from_doc({"gpu": NOMINAL[p]}), preemptible_max_priority=50)
        for p in PROJECTS
    }
    preempted: dict[str, int] = {}  # rule -> gangs
    lost_gpu_s = 0.0
    requeued = 0
    wait_by: dict[tuple[str, int], list[float]] = {}
    holding: dict[str, int] = dict.fromkeys(PROJECTS, 0)
    on: dict[str, dict[str, int]] = {p: {} for p in PROJECTS}
    peak: dict[str, int] = dict.fromkeys(PROJECTS, 0)
    queue: dict[str, QueuedJob] = {}
    queued_jobs: dict[str, QueuedJob] = {}  # every job ever queued (a preempted one is queued again)
    info: dict[str, tuple[str, float, float, int]] = {}  # job -> (project, queued at, duration, priority)
    waits: dict[str, list[float]] = {p: [] for p in PROJECTS}
    sched_s = 0.0
    plain_s = 0.0
    passes = admitted = 0
    busy_gpu_s = 0.0
    now, i = 0.0, 0
    end_of_arrivals = arrivals[-1][0]
    while i < len(arrivals) or queue or running:
        next_arrival = arrivals[i][0] if i < len(arrivals) else float("inf")
        next_end = running[0][0] if running else float("inf")
        step = min(next_arrival, next_end)
        if step == float("inf"):
            break
        busy_gpu_s += sum(busy.values()) * (step - now) if now <= end_of_arrivals else 0.0
        if now <= end_of_arrivals:
            bucket = windows.setdefault(int(now // 3600), dict.fromkeys(PROJECTS, 0.0))
            for p in PROJECTS:
                bucket[p] += holding[p] * (step - now)
        now = step
        while running and running[0][0] <= now:
            at_end, job_id, host, project = heapq.heappop(running)
            if ends.get(job_id) != at_end:
                continue  # preempted: it ended at its grace period's end instead
            del ends[job_id]
            busy[host] -= 1
            holding[project] -= 1
            on[project][host] -= 1
            started.pop(job_id, None)
            if job_id in victims:  # requeued in its place, its whole duration again; its GPU held
                holds.append(Hold(host, victims.pop(job_id), 1, now + HOLD_FOR))
                old = queued_jobs[job_id]
                again = replace(old, id=f"{job_id}+", status_message=None)
                queue[again.id] = again
                queued_jobs[again.id] = again
                info[again.id] = (project, now, info[job_id][2], info[job_id][3])
                requeued += 1
        while i < len(arrivals) and arrivals[i][0] <= now:
            at, n, project, duration, prio = arrivals[i]
            job = QueuedJob(
                id=f"j{n}", run_id=f"r{n}", project_id=project, run_name=f"run-{n}", job_num=0, priority=prio,
                submitted_at=at, requirements=ONE_GPU, fleet_names=None, creation_policy="reuse",
                wait=WaitPolicy(True), project_name=project,
            )  # fmt: skip
            queue[job.id] = job
            queued_jobs[job.id] = job
            info[job.id] = (project, at, duration, prio)
            i += 1
        insts = tuple(
            InstanceSlot(
                id=h, fleet_id="f", name=h, instance_num=k, status="busy" if busy[h] else "idle", resources=HOST,
                total_blocks=gpus, busy_blocks=busy[h], backend="ssh",
            )
            for k, h in enumerate(busy)
        )  # fmt: skip
        fleet = FleetSlot(
            id="f", project_id="a", name="gpus", nodes_min=hosts, nodes_max=hosts, blocks=gpus, placement="any",
            offers=(), instances=insts, project_name="a", importer_project_ids=frozenset({"b", "c"}),
        )  # fmt: skip
        quotas = {
            p: ProjectQuota(
                limits_from_doc({"gpu": maxes[p]}),
                {"gpu": float(holding[p]), "gpu:H100": float(holding[p]), "cpu": float(holding[p] * 8)},
                frozenset(h for h, c in on[p].items() if c > 0),
                p,
            )
            for p in PROJECTS
            if not no_max
        }
        nominal = {p: policies[p].nominal if a.preempt else Limits() for p in PROJECTS}
        shares = {
            p: FairShare(weights[p], nominal[p], {"gpu": float(holding[p]), "gpu:H100": float(holding[p])})
            for p in PROJECTS
        }
        waiting_runs = {q.run_id for q in queue.values()}
        holds = [h for h in holds if h.until > now and h.run_id in waiting_runs]
        snap = Snapshot(
            fleets=(fleet,), queue=tuple(queue.values()), quotas=quotas, shares=shares if a.fair else {},
            holds=tuple(holds),
        )  # fmt: skip
        t0 = time.perf_counter()
        plan = schedule(snap, now)
        sched_s += time.perf_counter() - t0
        if passes % 50 == 0:  # the same pass without quotas, for the cost of the quota gate
            t0 = time.perf_counter()
            schedule(replace(snap, quotas={}, shares={}), now)
            plain_s += (time.perf_counter() - t0) * 50
        passes += 1
        for gang in plan.gangs:
            for d in gang.decisions:
                if isinstance(d, Wait):  # the commit point writes the message, the next pass reads it
                    queue[d.job_id] = queued_jobs[d.job_id] = replace(queue[d.job_id], status_message=d.message)
                elif isinstance(d, Assign):
                    project, at, duration, prio = info[d.job_id]
                    del queue[d.job_id]
                    busy[d.instance_id] += d.blocks
                    holding[project] += d.blocks
                    on[project][d.instance_id] = on[project].get(d.instance_id, 0) + 1
                    peak[project] = max(peak[project], holding[project])
                    heapq.heappush(running, (now + duration, d.job_id, d.instance_id, project))
                    ends[d.job_id] = now + duration
                    started[d.job_id] = (now, d.instance_id, prio)
                    waits[project].append(now - at)
                    wait_by.setdefault((project, prio), []).append(now - at)
                    admitted += 1
        if a.preempt:
            live = [
                RunningJob(
                    j, queued_jobs[j].run_id, queued_jobs[j].run_name, info[j][0], prio, at, "task", host, 1,
                    ONE_BLOCK, stopping=j in victims,
                )
                for j, (at, host, prio) in started.items()
            ]  # fmt: skip
            for p in choose(snap, plan, live, policies, PREEMPTION, now, schedule):
                preempted[p.rule] = preempted.get(p.rule, 0) + 1
                for j in p.job_ids:
                    victims[j] = p.preemptor_run_id
                    at, host, _prio = started[j]
                    ends[j] = now + PREEMPTION.grace_period
                    heapq.heappush(running, (ends[j], j, host, info[j][0]))
                    lost_gpu_s += ends[j] - at
        assert all(holding[p] <= maxes[p] for p in PROJECTS), holding

    shown = "none" if no_max else maxes
    print(f"simulated: {a.jobs} jobs, 3 projects weighted 1:2:3 (fair share {'on' if a.fair else 'off'}),")
    print(f"  {hosts * gpus} GPUs, quota.max gpu {shown}")
    print(f"passes: {passes}, admitted: {admitted}, simulated span {now / 3600:.1f} h")
    print(
        f"scheduler time: {sched_s:.2f} s with quotas/shares ({admitted / sched_s:,.0f} admissions/s,"
        f" {passes / sched_s:,.0f} passes/s); about {plain_s:.2f} s for the same passes without either"
    )
    full = [win for k, win in sorted(windows.items()) if 0 < k < int(end_of_arrivals // 3600)]
    if full:
        errors: dict[str, list[float]] = {p: [] for p in PROJECTS}
        for win in full:
            total = sum(win.values()) or 1.0
            for p in PROJECTS:
                entitled = weights[p] / sum(weights.values())
                errors[p].append(abs(win[p] / total - entitled) / entitled)
        for p in PROJECTS:
            print(
                f"project {p}: share vs entitlement {weights[p] / 6:.1%} over {len(full)} 1-h windows:"
                f" mean error {statistics.mean(errors[p]):.1%}, max {max(errors[p]):.1%}"
            )
    util = busy_gpu_s / (hosts * gpus * end_of_arrivals)
    print(f"GPU utilisation while jobs arrive: {util:.1%}")
    if a.preempt:
        within = preempted.get("within_project", 0)
        print(
            f"preemptions: {within + preempted.get(RECLAIM, 0)} ({within} within a project,"
            f" {preempted.get(RECLAIM, 0)} reclaims), {requeued} requeued;"
            f" GPU-hours lost to them: {lost_gpu_s / 3600:.1f} of {busy_gpu_s / 3600:.0f} served"
        )
        for (p, prio), w in sorted(wait_by.items()):
            w.sort()
            print(
                f"project {p} priority {prio:>2}: {len(w)} admitted, wait p50 {statistics.median(w) / 60:.0f} min,"
                f" p90 {w[int(len(w) * 0.9)] / 60:.0f}"
            )
    for p in PROJECTS:
        w = sorted(waits[p])
        p50 = statistics.median(w) / 60 if w else 0.0
        p90 = w[int(len(w) * 0.9)] / 60 if w else 0.0
        cap = "-" if no_max else maxes[p]
        print(f"project {p}: peak {peak[p]}/{cap} GPUs, {len(w)} admitted, wait p50 {p50:.0f} min, p90 {p90:.0f}")


if __name__ == "__main__":
    main()
