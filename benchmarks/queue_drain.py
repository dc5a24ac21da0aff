#!/usr/bin/env python3
"""Queue drain: N trivial jobs submitted at once to a local fleet of 4 instances.

Starts `corral server` as a process with fresh state, creates a fleet with `nodes: 4` (its instances come
up through nodes.min upkeep), submits N runs (`echo ok`) from 8 concurrent clients, and measures:
- placements per second (jobs that left `submitted`, from the runs list over time) and the total drain time;
- the API's latency while the queue drains (`runs/get` and the `dstack ps` list body, sampled).
With ``--timeline`` it also reads the server's events (every job and run status change, with its time) from
its database and prints where a job's time went: the median of each stage, the gap on an instance
between one job ending and the next one placed on it, and one job's timeline. With ``--postgres`` the state
is a throwaway Postgres cluster served by two server replicas (the submitting clients and the samples split
between them). With ``--cpu`` it prints where the machine's CPU went over the run, per job, by role: the
server, the agents and the processes they start, the job launchers and the jobs, the kernel's workers, the
benchmark itself (``benchlib/proc_cpu.py``). Figures, not assertions.

    python benchmarks/queue_drain.py [--jobs 1000] [--timeline] [--postgres] [--cpu]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import itertools
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import proc_cpu
from benchlib.load import pct
from benchlib.servers import free_port

RES = {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."}
PS_BODY = {"project_name": "main", "only_active": True, "include_jobs": True, "job_submissions_limit": 1, "limit": 100}


def start_servers(tmp: str, db_url: str | None, count: int) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    """``count`` server processes on one database (``db_url``; None: each its own SQLite), their URLs."""
    key = base64.b64encode(os.urandom(32)).decode()  # the replicas of one database share the key
    procs, urls = [], []
    for i in range(count):
        port = free_port()
        env = {
            **os.environ,
            "CORRAL_SERVER_DIR": f"{tmp}/state" if i == 0 else f"{tmp}/state{i}",
            "CORRAL_CONFIG_DIR": f"{tmp}/cli{i}",
            "CORRAL_SERVER_ADMIN_TOKEN": "bench",
            "CORRAL_SERVER_ENCRYPTION_KEY": key,
            "CORRAL_LOCAL_INSTANCES_DIR": f"{tmp}/instances",
            "CORRAL_LOCAL_MAX_INSTANCES": "8",
            "CORRAL_LOCAL_CPUS": "16",  # the machine the local backend divides: room for the 4 instances anywhere
            "CORRAL_LOCAL_MEMORY": "128GB",
            **({"CORRAL_DATABASE_URL": db_url} if db_url else {}),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "corral.cli.main", "server", "--port", str(port)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        urls.append(f"http://127.0.0.1:{port}")
    return procs, urls


async def main_async(n_jobs: int, timeline: bool, postgres: bool, cpu: bool = False) -> None:
    cluster = None
    cpu_lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        db_url = None
        if postgres:
            from benchlib.postgres import Cluster

            cluster = Cluster()
            db_url = cluster.fresh_database("queue_drain")
        procs, urls = start_servers(tmp, db_url, 2 if postgres else 1)
        try:
            headers = {"Authorization": "Bearer bench"}
            clients = [httpx.AsyncClient(base_url=u, headers=headers, timeout=60) for u in urls]
            for client in clients:
                while True:
                    try:
                        await client.get("/healthcheck")
                        break
                    except httpx.HTTPError:
                        await asyncio.sleep(0.05)
            async with contextlib.AsyncExitStack() as stack:
                for client in clients:
                    stack.push_async_callback(client.aclose)
                c = clients[0]
                fleet = {"type": "fleet", "name": "drain", "nodes": 4, "resources": RES}
                await c.post(
                    "/api/project/main/fleets/apply",
                    json={"force": True, "plan": {"spec": {"configuration": fleet, "profile": {}}}},
                )
                while sum(i["status"] == "idle" for i in (await c.post("/api/instances/list", json={})).json()) < 4:
                    await asyncio.sleep(0.1)
                body = {
                    "force": False,
                    "plan": {
                        "run_spec": {
                            "configuration": {
                                "type": "task",
                                "commands": ["echo ok"],
                                "resources": RES,
                                "fleets": ["drain"],
                            }
                        }
                    },
                }
                queue: asyncio.Queue[int] = asyncio.Queue()
                for i in range(n_jobs):
                    queue.put_nowait(i)
                apply_lat: list[float] = []

                async def submitter(k: int) -> None:
                    mine = clients[k % len(clients)]
                    while not queue.empty():
                        queue.get_nowait()
                        t = time.perf_counter()
                        r = await mine.post("/api/project/main/runs/apply", json=body)
                        r.raise_for_status()
                        apply_lat.append(time.perf_counter() - t)

                cpu_before = proc_cpu.sample() if cpu else None
                t0 = time.perf_counter()
                await asyncio.gather(*(submitter(k) for k in range(8)))
                submitted_in = time.perf_counter() - t0
                get_lat: list[float] = []
                ps_lat: list[float] = []
                progress: list[tuple[float, int]] = []
                for sample in itertools.count():
                    c = clients[sample % len(clients)]
                    t = time.perf_counter()
                    page = (await c.post("/api/runs/list", json=PS_BODY)).json()
                    ps_lat.append(time.perf_counter() - t)
                    if page:
                        t = time.perf_counter()
                        await c.post("/api/project/main/runs/get", json={"run_name": page[-1]["run_spec"]["run_name"]})
                        get_lat.append(time.perf_counter() - t)
                    active = len(page)
                    progress.append((time.perf_counter() - t0, active))
                    if active == 0:
                        break
                    await asyncio.sleep(0.25)
                total = time.perf_counter() - t0
                if cpu_before is not None:
                    cpu_lines = proc_cpu.report(cpu_before, proc_cpu.sample(), n_jobs)
                runs: list[dict[str, Any]] = []
                prev: tuple[float, str] | None = None
                while True:
                    req: dict[str, Any] = {"limit": 100, "job_submissions_limit": 1}
                    if prev:
                        req.update(prev_submitted_at=prev[0], prev_run_id=prev[1])
                    batch = (await c.post("/api/runs/list", json=req)).json()
                    if not batch:
                        break
                    runs += batch
                    prev = (batch[-1]["submitted_at"], batch[-1]["id"])  # type: ignore[assignment]
                if timeline:
                    rows = await timeline_rows(db_url, Path(tmp) / "state" / "data" / "corral.db")
                    report_timeline(*rows)
                statuses = statistics.multimode([r["status"] for r in runs])
                done = sum(r["status"] == "done" for r in runs)
                await c.post("/api/project/main/fleets/delete", json={"names": ["drain"]})
                for _ in range(100):
                    if all(i["status"] == "terminated" for i in (await c.post("/api/instances/list", json={})).json()):
                        break
                    await asyncio.sleep(0.2)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(30)
            if cluster is not None:
                cluster.stop()
    ms = 1000
    where = "Postgres, 2 server replicas" if postgres else "SQLite, 1 server"
    print(
        f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; {where}; {n_jobs} jobs, "
        "fleet of 4 local instances, 8 submitting clients"
    )
    print(
        f"submitted all in {submitted_in:.1f} s ({n_jobs / submitted_in:.0f} applies/s; "
        f"apply p50 {statistics.median(apply_lat) * ms:.0f} ms, p99 {pct(apply_lat, 0.99) * ms:.0f} ms)"
    )
    print(
        f"queue drained in {total:.1f} s: {n_jobs / total:.1f} jobs placed and run per second; "
        f"{done}/{len(runs)} done (most common status: {statuses})"
    )
    print(
        f"while draining: ps body p50 {statistics.median(ps_lat) * ms:.0f} ms, p99 {pct(ps_lat, 0.99) * ms:.0f} ms; "
        f"runs/get p50 {statistics.median(get_lat) * ms:.0f} ms, p99 {pct(get_lat, 0.99) * ms:.0f} ms"
    )
    for line in cpu_lines:
        print(line)


STEPS = ("submitted", "provisioning", "pulling", "running", "done", "run ended")


EVENTS_SQL = (
    "SELECT t.entity_type, t.entity_id, t.entity_run_id, e.message, e.recorded_at FROM events e "
    "JOIN event_targets t ON t.event_id = e.id WHERE t.entity_type IN ('job', 'run') ORDER BY e.recorded_at"
)
Rows = list[tuple[Any, ...]]


async def timeline_rows(db_url: str | None, sqlite_file: Path) -> tuple[Rows, dict[str, str], dict[str, float]]:
    """The job and run events, each job's instance and each run's submission time (SQLite file or Postgres)."""
    if db_url is None:
        con = sqlite3.connect(f"file:{sqlite_file}?mode=ro", uri=True)
        rows = con.execute(EVENTS_SQL).fetchall()
        placed_on = dict(con.execute("SELECT id, instance_id FROM jobs").fetchall())
        submitted = dict(con.execute("SELECT id, submitted_at FROM runs").fetchall())
        con.close()
        return rows, placed_on, submitted
    import asyncpg

    pg = await asyncpg.connect(db_url.replace("postgresql+asyncpg", "postgresql"))
    try:
        rows = [tuple(r) for r in await pg.fetch(EVENTS_SQL)]
        placed_on = {r[0]: r[1] for r in await pg.fetch("SELECT id, instance_id FROM jobs")}
        submitted = {r[0]: r[1] for r in await pg.fetch("SELECT id, submitted_at FROM runs")}
    finally:
        await pg.close()
    return rows, placed_on, submitted


def report_timeline(rows: Rows, placed_on: dict[str, str], submitted: dict[str, float]) -> None:
    """Each job's status changes and its run's end, from the events the servers recorded."""
    jobs: dict[str, dict[str, float]] = {}
    run_done: dict[str, float] = {}
    run_of: dict[str, str] = {}
    for kind, entity, run_id, message, at in rows:
        if " -> " not in message:
            continue
        new = message.split(" -> ", 1)[1].split()[0].rstrip(".").lower()
        if kind == "job":
            jobs.setdefault(entity, {}).setdefault(new, at)
            run_of[entity] = run_id
        elif new in ("done", "failed", "terminated"):
            run_done.setdefault(entity, at)
    for job_id, marks in jobs.items():
        marks["submitted"] = submitted.get(run_of[job_id], marks.get("provisioning", 0.0))
        if run_of[job_id] in run_done:
            marks["run ended"] = run_done[run_of[job_id]]
    ms = 1000
    stages: dict[tuple[str, str], list[float]] = {}
    for marks in jobs.values():
        seq = sorted(marks.items(), key=lambda kv: (kv[1], STEPS.index(kv[0]) if kv[0] in STEPS else 99))
        for (a, ta), (b, tb) in itertools.pairwise(seq):
            stages.setdefault((a, b), []).append(tb - ta)
    print("where a job's time went (median over jobs, ms):")
    for (a, b), gaps in sorted(stages.items(), key=lambda kv: -len(kv[1])):
        med, p90 = statistics.median(gaps) * ms, pct(gaps, 0.9) * ms
        print(f"  {a:>12} -> {b:<12} {med:8.1f}   (p90 {p90:.1f}, n={len(gaps)})")
    by_instance: dict[str, list[dict[str, float]]] = {}
    for job_id, marks in jobs.items():
        if placed_on.get(job_id) and "provisioning" in marks:
            by_instance.setdefault(placed_on[job_id], []).append(marks)
    turn = []
    for seq in by_instance.values():
        seq.sort(key=lambda m: m["provisioning"])
        turn += [b["provisioning"] - a["done"] for a, b in itertools.pairwise(seq) if "done" in a]
    if turn:
        med, p90 = statistics.median(turn) * ms, pct(turn, 0.9) * ms
        print(f"  an instance idle from a job's DONE to the next job placed on it: median {med:.1f} ms (p90 {p90:.1f})")
    sample = next(
        (m for m in sorted(jobs.values(), key=lambda m: m["submitted"])[len(jobs) // 2 :] if "run ended" in m), None
    )
    if sample:
        t0 = sample["submitted"]
        print(
            "  one job: "
            + ", ".join(f"{k} +{(v - t0) * ms:.0f} ms" for k, v in sorted(sample.items(), key=lambda kv: kv[1]))
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--timeline", action="store_true", help="print where a job's time went (from the events)")
    parser.add_argument("--postgres", action="store_true", help="a throwaway Postgres cluster, 2 server replicas")
    parser.add_argument("--cpu", action="store_true", help="print each role's CPU per job (server, agents, ...)")
    args = parser.parse_args()
    asyncio.run(main_async(args.jobs, args.timeline, args.postgres, args.cpu))


if __name__ == "__main__":
    main()
