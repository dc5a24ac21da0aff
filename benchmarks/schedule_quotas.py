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
drops the quotas. It then prints, per 1-hour window (after the first hour, while jobs arrive), each project's
GPU-time against its entitlement over the same window: at each moment, its nominal quota (``--preempt``) as far
as it asks for it, then the rest of the GPUs water-filled by weight over what each project asks for (running
plus queued: weighted max-min, as ``entitlement`` here computes it; 64 x w / 6 GPUs when every project asks
for more), integrated over the window. Mean and max relative error per project, and Jain's index of the
got/entitled ratios per window. ``--sizes mixed`` draws jobs of 1/2/4/8 GPUs (40/25/20/15 %).

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
                                         [--sizes one|mixed] [--warm-up 24] [--windows]
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
SIZES = ((1, 0.40), (2, 0.25), (4, 0.20), (8, 0.15))  # --sizes mixed: GPUs per job and their share of the jobs


def entitlement(
    capacity: float, weights: dict[str, float], demand: dict[str, float], nominal: dict[str, float]
) -> dict[str, float]:
    """Each project's entitlement now: its nominal quota as far as it asks for it, then the rest of the
    capacity water-filled by weight (weighted max-min) over what each still asks for. With every project
    asking for more than its part this is ``capacity * w / sum(w)``; a project asking for less is entitled
    to what it asks, and the others split what it leaves."""
    give = {p: min(demand[p], nominal.get(p, 0.0)) for p in weights}
    scale = min(1.0, capacity / sum(give.values())) if sum(give.values()) else 1.0
    give = {p: g * scale for p, g in give.items()}
    left = capacity - sum(give.values())
    open_ = {p for p in weights if demand[p] - give[p] > 1e-9}
    while left > 1e-9 and open_:
        per = left / sum(weights[p] for p in open_)
        full = {p for p in open_ if demand[p] - give[p] <= per * weights[p]}
        if not full:
            for p in open_:
                give[p] += per * weights[p]
            break
        for p in full:
            left -= demand[p] - give[p]
            give[p] = demand[p]
        open_ -= full
    return give


def report_shares(
    label: str,
    full: list[int],
    windows: dict[int, dict[str, float]],
    entitled: dict[int, dict[str, float]],
    weights: dict[str, float],
) -> None:
    """Each project's GPU-time against its entitlement over the 1-hour ``full`` windows, and Jain's index."""
    if not full:
        return
    print(f"share against entitlement in 1-h windows {label} ({len(full)} windows):")
    errors: dict[str, list[float]] = {p: [] for p in PROJECTS}
    jain: list[float] = []
    capacity = sum(entitled[full[0]].values()) or 1.0
    for k in full:
        got, due = windows[k], entitled[k]
        ratios = []
        for p in PROJECTS:
            if due[p] > 0.01 * capacity:  # a project entitled to under 1 % of the window: no ratio
                errors[p].append(abs(got[p] - due[p]) / due[p])
                ratios.append(got[p] / due[p])
        if ratios:
            jain.append(sum(ratios) ** 2 / (len(ratios) * sum(r * r for r in ratios)))
    for p in PROJECTS:
        mean_due = statistics.mean(entitled[k][p] for k in full) / 3600
        e = errors[p] or [0.0]
        print(
            f"  project {p} (weight {weights[p]:.0f}, entitled to {mean_due:.1f} GPUs on average):"
            f" mean error {statistics.mean(e):.1%}, max {max(e):.1%}"
        )
    print(f"  Jain's index of got/entitled per window: mean {statistics.mean(jain):.4f}, min {min(jain):.4f}")


def pick_size(rng: random.Random) -> int:
    pick = rng.random()
    for size, share in SIZES:
        if pick < share:
            return size
        pick -= share
    return SIZES[-1][0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--max", default=None, help="each project's quota.max on GPUs, or none (default 16,24,32)")
    ap.add_argument("--fair", action="store_true", help="fair share by the weights 1:2:3")
    ap.add_argument("--load", type=float, default=1.2, help="arrivals against what the GPUs serve")
    ap.add_argument("--preempt", action="store_true", help="mixed priorities, nominal quotas, preemption on")
    ap.add_argument("--windows", action="store_true", help="print every 1-h window's GPUs got and entitled")
    ap.add_argument("--warm-up", type=float, default=24.0, help="hours left out of the second share figure")
    ap.add_argument("--sizes", choices=("one", "mixed"), default="one", help="1 GPU a job, or 1/2/4/8 (40/25/20/15 %%)")
    a = ap.parse_args()
    if a.max is None:
        a.max = "none" if a.preempt else "16,24,32"
    a.fair = a.fair or a.preempt
    rng = random.Random(a.seed)
    weights = dict(zip(PROJECTS, (1.0, 2.0, 3.0), strict=True))
    no_max = a.max == "none"
    maxes = dict(zip(PROJECTS, (10**9,) * 3 if no_max else (int(x) for x in a.max.split(",")), strict=True))
    windows: dict[int, dict[str, float]] = {}
    entitled: dict[int, dict[str, float]] = {}  # window -> project -> GPU-seconds it was entitled to
    size_of: dict[str, int] = {}  # job -> its GPUs
    hosts, gpus = 8, 8
    median_s = 1800.0
    mean_s = median_s * 1.0  # log-normal with sigma 1 has mean ~1.65x median; rate set from it below
    mean_size = sum(size * share for size, share in SIZES) if a.sizes == "mixed" else 1.0
    rate = a.load * hosts * gpus / (mean_s * 1.65 * mean_size)  # arrivals of GPU-time at ``load`` x the GPUs
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
        size = pick_size(rng) if a.sizes == "mixed" else 1
        arrivals.append((t, n, project, duration, priority if a.preempt else 0, size))

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
            ent_bucket = entitled.setdefault(int(now // 3600), dict.fromkeys(PROJECTS, 0.0))
            demand = {p: float(holding[p]) for p in PROJECTS}
            for q in queue.values():
                demand[q.project_id] += size_of[q.id]
            caps = {p: min(demand[p], float(maxes[p])) for p in PROJECTS}
            nominal_gpus = {p: float(NOMINAL[p]) for p in PROJECTS} if a.preempt else {}
            for proj, due_now in entitlement(float(hosts * gpus), weights, caps, nominal_gpus).items():
                ent_bucket[proj] += due_now * (step - now)
            for p in PROJECTS:
                bucket[p] += holding[p] * (step - now)
        now = step
        while running and running[0][0] <= now:
            at_end, job_id, host, project = heapq.heappop(running)
            if ends.get(job_id) != at_end:
                continue  # preempted: it ended at its grace period's end instead
            del ends[job_id]
            busy[host] -= size_of[job_id]
            holding[project] -= size_of[job_id]
            on[project][host] -= 1
            started.pop(job_id, None)
            if job_id in victims:  # requeued in its place, its whole duration again; its GPU held
                holds.append(Hold(host, victims.pop(job_id), size_of[job_id], now + HOLD_FOR))
                old = queued_jobs[job_id]
                again = replace(old, id=f"{job_id}+", status_message=None)
                size_of[again.id] = size_of[job_id]
                queue[again.id] = again
                queued_jobs[again.id] = again
                info[again.id] = (project, now, info[job_id][2], info[job_id][3])
                requeued += 1
        while i < len(arrivals) and arrivals[i][0] <= now:
            at, n, project, duration, prio, size = arrivals[i]
            need = ONE_GPU if size == 1 else replace(ONE_GPU, gpu=GpuSpec(count=Range(size, size)))
            job = QueuedJob(
                id=f"j{n}", run_id=f"r{n}", project_id=project, run_name=f"run-{n}", job_num=0, priority=prio,
                submitted_at=at, requirements=need, fleet_names=None, creation_policy="reuse",
                wait=WaitPolicy(True), project_name=project,
            )  # fmt: skip
            queue[job.id] = job
            queued_jobs[job.id] = job
            info[job.id] = (project, at, duration, prio)
            size_of[job.id] = size
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
                    j, queued_jobs[j].run_id, queued_jobs[j].run_name, info[j][0], prio, at, "task", host,
                    size_of[j], ONE_BLOCK if size_of[j] == 1 else charge(["H100"] * 8, 64, 524288, 0.0, size_of[j], 8),
                    stopping=j in victims,
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
                    lost_gpu_s += (ends[j] - at) * size_of[j]
        assert all(holding[p] <= maxes[p] for p in PROJECTS), holding

    shown = "none" if no_max else maxes
    print(f"simulated: {a.jobs} jobs, 3 projects weighted 1:2:3 (fair share {'on' if a.fair else 'off'}),")
    print(f"  {hosts * gpus} GPUs, quota.max gpu {shown}")
    print(f"passes: {passes}, admitted: {admitted}, simulated span {now / 3600:.1f} h")
    print(
        f"scheduler time: {sched_s:.2f} s with quotas/shares ({admitted / sched_s:,.0f} admissions/s,"
        f" {passes / sched_s:,.0f} passes/s); about {plain_s:.2f} s for the same passes without either"
    )
    last = int(end_of_arrivals // 3600)
    if a.windows:
        print("hour: GPUs each project held on average / was entitled to")
        for k in sorted(windows):
            cells = (f"{p} {windows[k][p] / 3600:5.1f}/{entitled[k][p] / 3600:5.1f}" for p in PROJECTS)
            print(f"{k:4d}: " + ", ".join(cells))
    for label, first in (("after the first hour", 1), (f"after a {a.warm_up:.0f}-h warm-up", int(a.warm_up))):
        report_shares(label, [k for k in sorted(windows) if first <= k < last], windows, entitled, weights)
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
