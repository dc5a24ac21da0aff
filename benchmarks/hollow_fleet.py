#!/usr/bin/env python3
"""Hollow fleet: thousands of simulated hosts driving the real server, checked from the hosts' own record.

    python benchmarks/hollow_fleet.py --instances 2000 --jobs 100000 [--postgres --replicas 2] [--json FILE]

One process (``benchlib/hollow.py``) simulates every host of several SSH fleets and the corral agent on
each; ``corral server`` (1 process on SQLite, or ``--replicas`` processes on a throwaway Postgres cluster)
takes them over and runs jobs on them through its ordinary code: ``fleets/apply`` with ``ssh_config``, the
SSH backend's bootstrap over SSH, the agent's HTTP protocol through the port forwarded over each host's
SSH connection, the scheduler, the commit point, the jobs worker's submission and follower.

**Why SSH, and why one asyncssh listener rather than OpenSSH.** The server reaches SSH hosts' agents only
through ``backends/ssh.py``'s ``HostLink`` (one SSH connection per host, a local port forwarded to the
agent's loopback port); there is no setting that points the server at an agent URL, and adding one would be
the special path this benchmark must not have. So the hollow hosts are SSH hosts: each is a loopback
address (``127.64.x.y``) at the hollow process's one SSH port, logged in to with a key the fleet's
``ssh_config`` carries, as the CLI sends it. The server side is entirely real (asyncssh client, bootstrap
scripts, tunnel, ``AgentClient``); only the far side of the SSH connection is simulated: the bootstrap's
commands are answered as a host with ``python3`` answers them and the agent's requests with the protocol's
own dataclasses. A real OpenSSH ``sshd`` per host costs two processes and several MB per connection (GBs at
2,000 hosts) and would then run the real agent, which is what the hollow agent replaces.

**What it measures.** The hosts' bootstrap time; placements per second (jobs started on the hollow hosts
per second between the first apply and the last start); apply-to-running (from an apply's answer to the
job's start on its host, for the jobs that found a free block); the API's p50/p99 under that load
(``runs/apply`` as submitted, the ``dstack ps`` body, ``runs/get``, ``fleets/list``); the server
processes' CPU seconds and peak RSS; the database's growth (SQLite's files, or ``pg_database_size``).

**What it checks, from the hollow hosts' record** (host, job, start, end), never from the server's rows:
- ``max_over_cap``: the most blocks ever in use beyond a host's blocks, or beyond a fleet's (its hosts
  times their blocks), and the most instances ever in use by the capped project beyond its ``quota.max``
  ``instances`` (smaller than its fleet's hosts, so that cap is exercised): each must be 0;
- ``order_inversions``: jobs of one project and fleet (all of one shape) where a job took the fleet's last
  free block (or the capped project's last instance under its quota) while one of higher priority, or of the
  same priority applied earlier, had been applied more than ``--slack`` seconds before and started more than
  ``--slack`` seconds after it (the scheduler's order: priority, then submission
  time). A host sees a job when the jobs worker hands it over, which follows its placement by a delay that
  varies from job to job (up to 12 s, p90 8.6 s, with 2,000 hosts on a busy 2-core machine), so order is
  checked only to that slack (default 15 s); placements closer together than that are not told apart;
- ``done``: jobs the hosts ran to their end (each once: ``ran_twice`` counts a job started twice).

Figures, not assertions (the exit status is 1 only when a check fails or a job did not end).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import bisect
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from corral.known_warnings import install_filters

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import procs
from benchlib.load import pct
from benchlib.servers import free_port

TOKEN = "hollow-bench"
RES = {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."}
PS_BODY = {"project_name": "main", "only_active": True, "include_jobs": True, "job_submissions_limit": 1, "limit": 100}
PRIORITIES = (10, 50, 90)
CAPPED = "capped"


@dataclass
class Applied:
    run_name: str
    project: str
    fleet: str
    priority: int
    applied_at: float


@dataclass
class Bench:
    args: argparse.Namespace
    tmp: Path
    fleets: dict[str, tuple[str, list[str]]] = field(default_factory=dict)  # name -> (project, hosts)
    quota_instances: int = 0
    applied: list[Applied] = field(default_factory=list)
    lat: dict[str, list[float]] = field(default_factory=dict)
    rss_peak_kib: int = 0

    def timed(self, name: str, seconds: float) -> None:
        self.lat.setdefault(name, []).append(seconds)


# ---- processes -------------------------------------------------------------------------------------------
def start_hollow(b: Bench, pub: Path) -> tuple[subprocess.Popen[str], int]:
    cmd = [sys.executable, str(Path(__file__).parent / "benchlib" / "hollow.py"), "--authorized", str(pub)]
    cmd += ["--record", str(b.tmp / "record.json"), "--cpus", str(b.args.blocks), "--duration", b.args.duration]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if line[:1] != ["ready"]:
        proc.kill()
        raise SystemExit(f"the hollow process did not start: {line}")
    return proc, int(line[1])


def write_config(b: Bench) -> None:
    state = b.tmp / "state"
    state.mkdir(parents=True, exist_ok=True)
    text = f"projects:\n  - name: main\n  - name: {CAPPED}\n    quota:\n      max: {{instances: {b.quota_instances}}}\n"
    (state / "config.yml").write_text(text)


def start_servers(b: Bench, db_url: str | None) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    key = base64.b64encode(os.urandom(32)).decode()  # the replicas of one database share the key
    servers, urls = [], []
    for i in range(b.args.replicas):
        port = free_port()
        env = {
            **os.environ,
            "CORRAL_SERVER_DIR": str(b.tmp / ("state" if i == 0 else f"state{i}")),
            "CORRAL_CONFIG_DIR": str(b.tmp / f"cli{i}"),
            "CORRAL_SERVER_ADMIN_TOKEN": TOKEN,
            "CORRAL_SERVER_ENCRYPTION_KEY": key,
            "CORRAL_LOCAL_INSTANCES_DIR": str(b.tmp / "instances"),
            "CORRAL_PROVISIONING_TIMEOUT": "600",
            **({"CORRAL_DATABASE_URL": db_url} if db_url else {}),
        }
        log = open(b.tmp / f"server{i}.log", "wb")  # noqa: SIM115 - owned by the child
        cmd = [sys.executable, "-m", "corral.cli.main", "server", "--port", str(port)]
        servers.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
        log.close()
        urls.append(f"http://127.0.0.1:{port}")
    return servers, urls


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---- the fleets ------------------------------------------------------------------------------------------
def host_address(i: int) -> str:
    return f"127.64.{i // 250}.{i % 250 + 1}"


def plan_fleets(b: Bench) -> None:
    """``--fleets`` fleets in ``main`` and one in the capped project, the hosts dealt out in turn."""
    n, count = b.args.instances, b.args.fleets + 1
    names = [f"hollow-{k}" for k in range(b.args.fleets)] + ["hollow-capped"]
    for k, name in enumerate(names):
        hosts = [host_address(i) for i in range(k, n, count)]
        b.fleets[name] = (CAPPED if name == "hollow-capped" else "main", hosts)
    b.quota_instances = max(1, len(b.fleets["hollow-capped"][1]) // 2)


async def apply_fleets(b: Bench, c: httpx.AsyncClient, ssh_port: int, private_key: str, public_key: str) -> float:
    t0 = time.perf_counter()
    for name, (project, hosts) in b.fleets.items():
        ssh = {
            "user": "hollow",
            "port": ssh_port,
            "ssh_key": {"public": public_key, "private": private_key},
            "hosts": [{"hostname": h, "blocks": b.args.blocks} for h in hosts],
        }
        body = {
            "force": True,
            "plan": {"spec": {"configuration": {"type": "fleet", "name": name, "ssh_config": ssh}, "profile": {}}},
        }
        r = await c.post(f"/api/project/{project}/fleets/apply", json=body)
        if r.status_code != 200:
            raise SystemExit(f"fleets/apply {name}: {r.status_code} {r.text[:400]}")
    while True:
        statuses = []
        for name, (project, _) in b.fleets.items():
            fleet = (await c.post(f"/api/project/{project}/fleets/get", json={"name": name})).json()
            statuses += [(i["status"], i.get("termination_reason_message")) for i in fleet["instances"]]
        bad = [m for s, m in statuses if s == "terminated"]
        if bad:
            raise SystemExit(f"{len(bad)} hosts failed to come up, e.g. {bad[0]}")
        if sum(s == "idle" for s, _ in statuses) >= b.args.instances:
            return time.perf_counter() - t0
        await asyncio.sleep(2.0)


# ---- the jobs --------------------------------------------------------------------------------------------
def run_body(name: str, fleet: str, priority: int) -> dict[str, Any]:
    """A run named by the benchmark: names are unique per project only, and the hosts see the name alone."""
    conf = {"type": "task", "commands": ["hollow"], "resources": RES, "fleets": [fleet], "priority": priority}
    return {"force": False, "plan": {"run_spec": {"run_name": name, "configuration": conf}}}


async def submit_all(b: Bench, clients: list[httpx.AsyncClient]) -> None:
    rng = random.Random(b.args.seed)
    main_fleets = [f for f, (p, _) in b.fleets.items() if p == "main"]
    jobs = []
    for i in range(b.args.jobs):
        fleet = "hollow-capped" if rng.random() < 0.1 else rng.choice(main_fleets)
        jobs.append((f"h{i}", fleet, rng.choice(PRIORITIES)))
    queue = list(reversed(jobs))

    async def submitter(k: int) -> None:
        c = clients[k % len(clients)]
        while queue:
            name, fleet, priority = queue.pop()
            project = b.fleets[fleet][0]
            t = time.perf_counter()
            r = await c.post(f"/api/project/{project}/runs/apply", json=run_body(name, fleet, priority))
            b.timed("runs/apply", time.perf_counter() - t)
            if r.status_code != 200:
                raise SystemExit(f"runs/apply: {r.status_code} {r.text[:300]}")
            b.applied.append(Applied(name, project, fleet, priority, time.time()))

    await asyncio.gather(*(submitter(k) for k in range(b.args.clients)))


async def sample_api(b: Bench, clients: list[httpx.AsyncClient], servers: list[int], done: asyncio.Event) -> None:
    """The API's latency while the jobs run (a round of requests every ``--sample-every`` seconds), and the
    servers' peak RSS. The sampler watches the load, it is not part of it: a round back to back (one every
    quarter second, as before) took a fifth of the server's CPU with 2,000 hosts (``fleets/list``'s body)."""
    k = 0
    while not done.is_set():
        c = clients[k % len(clients)]
        k += 1
        for name, path, body in (
            ("ps body", "/api/runs/list", PS_BODY),
            ("fleets/list", "/api/project/main/fleets/list", {}),
        ):
            t = time.perf_counter()
            r = await c.post(path, json=body)
            b.timed(name, time.perf_counter() - t)
            if name == "ps body" and r.status_code == 200 and r.json():
                t = time.perf_counter()
                await c.post("/api/project/main/runs/get", json={"run_name": r.json()[-1]["run_spec"]["run_name"]})
                b.timed("runs/get", time.perf_counter() - t)
        b.rss_peak_kib = max(b.rss_peak_kib, sum(procs.rss_kib(p) for p in servers))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(done.wait(), b.args.sample_every)


async def wait_drained(c: httpx.AsyncClient, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        active = 0
        for project in ("main", CAPPED):
            body = {**PS_BODY, "project_name": project, "include_jobs": False}
            active += len((await c.post("/api/runs/list", json=body)).json())
        if active == 0:
            return True
        await asyncio.sleep(1.0)
    return False


# ---- the checks, from the hollow hosts' record -----------------------------------------------------------
Caps = tuple[dict[str, int], dict[str, int], dict[str, bool]]


def over_caps(b: Bench, ran: list[dict[str, Any]]) -> Caps:
    """The most blocks ever in use beyond a host's or a fleet's blocks, and instances beyond the quota; the
    most blocks one fleet and the capped project's instances ever had in use (the caps were reached); and for
    each run, whether its start left its fleet no free block (or the capped project at its quota)."""
    fleet_of = {h: name for name, (_, hosts) in b.fleets.items() for h in hosts}
    marks = []
    for r in ran:
        marks.append((r["start"], 1, r["host"], r["run_name"]))
        marks.append((r["end"] if r["end"] is not None else float("inf"), -1, r["host"], r["run_name"]))
    marks.sort(key=lambda m: (m[0], m[1]))  # at one instant, an end before a start
    on_host: dict[str, int] = {}
    on_fleet: dict[str, int] = {}
    capped_hosts = set(b.fleets["hollow-capped"][1])
    capped_busy = 0
    worst = {"host": 0, "fleet": 0, "quota_instances": 0, "unknown_host": 0}
    peak = {"fleet_blocks": 0, "quota_instances": 0}  # how close the busiest fleet and the quota came
    tight: dict[str, bool] = {}
    for _, delta, host, run in marks:
        fleet = fleet_of.get(host)
        if fleet is None:
            worst["unknown_host"] += delta > 0
            continue
        before = on_host.get(host, 0)
        on_host[host] = before + delta
        on_fleet[fleet] = on_fleet.get(fleet, 0) + delta
        if host in capped_hosts and (before == 0) != (on_host[host] == 0):
            capped_busy += delta
        worst["host"] = max(worst["host"], on_host[host] - b.args.blocks)
        worst["fleet"] = max(worst["fleet"], on_fleet[fleet] - len(b.fleets[fleet][1]) * b.args.blocks)
        worst["quota_instances"] = max(worst["quota_instances"], capped_busy - b.quota_instances)
        peak["fleet_blocks"] = max(peak["fleet_blocks"], on_fleet[fleet])
        peak["quota_instances"] = max(peak["quota_instances"], capped_busy)
        if delta > 0:
            full = on_fleet[fleet] >= len(b.fleets[fleet][1]) * b.args.blocks
            tight[run] = full or (host in capped_hosts and capped_busy >= b.quota_instances)
    return worst, peak, tight


def order_inversions(
    b: Bench, start_of: dict[str, float], tight: dict[str, bool], examples: list[str] | None = None
) -> int:
    """Jobs that took their fleet's last free block (or the capped project's last instance under its quota)
    while one that should go first (higher priority, or the same priority applied earlier) of their project
    and fleet had waited more than ``--slack`` seconds and started more than that later: capacity the waiting
    job could have used. (A waiting job that had room beside them waited for something else: latency.)"""
    slack, inf = b.args.slack, float("inf")
    groups: dict[tuple[str, str], list[Applied]] = {}
    for a in b.applied:
        groups.setdefault((a.project, a.fleet), []).append(a)
    count = 0
    for jobs in groups.values():
        by_level: dict[int, tuple[list[float], list[float]]] = {}
        for p in PRIORITIES:
            level = sorted((a for a in jobs if a.priority == p), key=lambda a: a.applied_at)
            prefix, top = [], -inf
            for a in level:
                top = max(top, start_of.get(a.run_name, inf))
                prefix.append(top)
            by_level[p] = ([a.applied_at for a in level], prefix)
        for a in jobs:
            s = start_of.get(a.run_name)
            if s is None or not tight.get(a.run_name):
                continue
            for p, (applied, prefix) in by_level.items():
                if p < a.priority:
                    continue
                before = s - slack if p > a.priority else min(s, a.applied_at) - slack
                i = bisect.bisect_left(applied, before)
                if i and prefix[i - 1] > s + slack:
                    count += 1
                    if examples is not None and len(examples) < 5:
                        examples.append(f"{a.run_name} (priority {a.priority}) started before a waiting {p}")
                    break
    return count


def check(b: Bench, record: dict[str, Any], t0: float) -> dict[str, Any]:
    ran = record["ran"]
    start_of: dict[str, float] = {}
    twice: list[str] = []
    for r in sorted(ran, key=lambda r: r["start"]):
        if r["run_name"] in start_of:
            twice.append(f"{r['run_name']} on {r['host']} ({r['job_id']}, {r['outcome']})")
        start_of.setdefault(r["run_name"], r["start"])
    worst, peak, tight = over_caps(b, ran)
    examples: list[str] = []
    starts = sorted(start_of.values())
    applied_at = {a.run_name: a.applied_at for a in b.applied}
    free = min(len(b.applied), b.args.instances * b.args.blocks) // 2
    first = [
        start_of[a.run_name] - a.applied_at
        for a in sorted(b.applied, key=lambda a: a.applied_at)[:free]
        if a.run_name in start_of
    ]
    waits = [start_of[n] - applied_at[n] for n in start_of if n in applied_at]
    return {
        "done": sum(r["outcome"] == "done" for r in ran),
        "max_over_cap": max(worst["host"], worst["fleet"], worst["quota_instances"], 0),
        "over_cap": worst,
        "peak": {
            **peak,
            "fleet_cap_blocks": max(len(h) for _, h in b.fleets.values()) * b.args.blocks,
            "quota_max_instances": b.quota_instances,
        },
        "ran_twice": len(twice),
        "order_inversions": order_inversions(b, start_of, tight, examples),
        "examples": {"ran_twice": twice[:5], "order_inversions": examples},
        "placements_per_s": len(starts) / max(1e-9, starts[-1] - t0) if starts else 0.0,
        "apply_to_running_free_p50_s": statistics.median(first) if first else None,
        "apply_to_running_all_p50_s": statistics.median(waits) if waits else None,
        "hollow_requests": record["requests"],
    }


# ---- the run ---------------------------------------------------------------------------------------------
async def db_bytes(b: Bench, db_url: str | None) -> int:
    if db_url is None:
        data = b.tmp / "state" / "data"
        return sum(p.stat().st_size for p in data.glob("corral.db*")) if data.exists() else 0
    import asyncpg

    con = await asyncpg.connect(db_url.replace("postgresql+asyncpg", "postgresql"))
    try:
        return int(await con.fetchval("SELECT pg_database_size(current_database())"))
    finally:
        await con.close()


async def drive(
    b: Bench, urls: list[str], servers: list[int], ssh: tuple[int, str, str], db_url: str | None
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(httpx.AsyncClient(base_url=u, headers=headers, timeout=120)) for u in urls
        ]
        for c in clients:
            for _ in range(600):
                with contextlib.suppress(httpx.HTTPError):
                    if (await c.get("/healthcheck")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
        bootstrap_s = await apply_fleets(b, clients[0], *ssh)
        idle0 = sum(cpu_seconds(p) for p in servers)
        await asyncio.sleep(b.args.idle)  # the hosts' upkeep alone: health checks, SSH keepalives
        idle_pct = 100 * (sum(cpu_seconds(p) for p in servers) - idle0) / max(b.args.idle, 1e-9)
        db0, cpu0 = await db_bytes(b, db_url), sum(cpu_seconds(p) for p in servers)
        done = asyncio.Event()
        sampler = asyncio.create_task(sample_api(b, clients, servers, done))
        t0 = time.time()
        await submit_all(b, clients)
        submitted_s = time.time() - t0
        drained = await wait_drained(clients[0], b.args.timeout)
        drain_s = time.time() - t0
        done.set()
        await sampler
        return {
            "t0": t0,
            "drained": drained,
            "bootstrap_s": round(bootstrap_s, 1),
            "idle_server_cpu_pct": round(idle_pct, 1),
            "submitted_s": round(submitted_s, 1),
            "drain_s": round(drain_s, 1),
            "server_cpu_s": round(sum(cpu_seconds(p) for p in servers) - cpu0, 1),
            "server_rss_peak_mib": round(b.rss_peak_kib / 1024, 1),
            "db_growth_mib": round((await db_bytes(b, db_url) - db0) / 2**20, 2),
        }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hollow-") as tmpd:
        b = Bench(args, Path(tmpd))
        install_filters()  # asyncssh's import-time DSA notice, as corral's own processes filter it
        import asyncssh

        key = asyncssh.generate_private_key("ssh-ed25519")
        pub = b.tmp / "key.pub"
        pub.write_bytes(key.export_public_key())
        plan_fleets(b)
        write_config(b)
        hollow, ssh_port = start_hollow(b, pub)
        cluster = None
        servers: list[subprocess.Popen[bytes]] = []
        load0 = os.getloadavg()[0]
        try:
            db_url = None
            if args.postgres:
                from benchlib.postgres import Cluster

                cluster = Cluster()
                db_url = cluster.fresh_database("hollow")
            servers, urls = start_servers(b, db_url)
            ssh = (ssh_port, key.export_private_key().decode(), key.export_public_key().decode().strip())
            figures = await drive(b, urls, [s.pid for s in servers], ssh, db_url)
            hollow_cpu = cpu_seconds(hollow.pid)
        finally:
            for s in servers:
                s.terminate()
            for s in servers:
                try:
                    s.wait(60)
                except subprocess.TimeoutExpired:
                    s.kill()
            hollow.send_signal(signal.SIGTERM)
            hollow.wait(120)
            if cluster is not None:
                cluster.stop()
        record = json.loads((b.tmp / "record.json").read_text())
        logs = [line for f in sorted(b.tmp.glob("server*.log")) for line in f.read_text(errors="replace").splitlines()]
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for f in [*b.tmp.glob("server*.log"), b.tmp / "record.json"]:
                (args.keep / f.name).write_bytes(f.read_bytes())
            (args.keep / "applied.json").write_text(json.dumps([a.__dict__ for a in b.applied]))
        result = {"instances": args.instances, "jobs": args.jobs, **check(b, record, figures.pop("t0")), **figures}
        result["hollow_cpu_s"] = round(hollow_cpu, 1)
        result["server_log_errors"] = sum(" ERROR " in line or line.startswith("Traceback") for line in logs)
        result["api_ms"] = {
            k: {"p50": round(statistics.median(v) * 1000, 1), "p99": round(pct(v, 0.99) * 1000, 1), "n": len(v)}
            for k, v in b.lat.items()
        }
        result["load"] = [round(load0, 1), round(os.getloadavg()[0], 1)]
        result["machine"] = f"{os.cpu_count()} CPUs; " + (
            f"Postgres, {args.replicas} replicas" if args.postgres else "SQLite, 1 server"
        )
        return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instances", type=int, default=2000, help="hollow hosts (all SSH fleets together)")
    p.add_argument("--jobs", type=int, default=100000, help="runs submitted (one job each)")
    p.add_argument("--fleets", type=int, default=4, help="fleets in project main (one more in the capped project)")
    p.add_argument("--blocks", type=int, default=2, help="blocks (and CPUs) of each hollow host")
    p.add_argument("--duration", default="0.5-3", help="seconds a job runs on its hollow host, drawn from LO-HI")
    p.add_argument("--clients", type=int, default=8, help="concurrent submitting clients")
    p.add_argument("--postgres", action="store_true", help="a throwaway Postgres cluster (with --replicas servers)")
    p.add_argument("--replicas", type=int, default=None, help="server processes (default 2 with --postgres, else 1)")
    p.add_argument("--slack", type=float, default=15.0, help="seconds of placement jitter the order check allows")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the queue to drain")
    p.add_argument("--idle", type=float, default=20.0, help="seconds the hosts' upkeep is measured before the jobs")
    p.add_argument("--sample-every", type=float, default=2.0, help="seconds between the API's latency samples")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", type=Path, default=None, help="copy the servers' logs and the record here")
    p.add_argument("--json", type=Path, default=None, help="write the figures and checks to this file")
    args = p.parse_args()
    if args.replicas is None:
        args.replicas = 2 if args.postgres else 1
    if args.replicas > 1 and not args.postgres:
        p.error("--replicas above 1 needs --postgres (replicas share one database)")
    if args.instances < args.fleets + 1 or args.jobs < 1:
        p.error("--instances must be at least --fleets + 1 (each fleet needs a host) and --jobs at least 1")
    result = asyncio.run(main_async(args))
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    failed = result["max_over_cap"] or result["ran_twice"] or result["done"] < args.jobs or not result["drained"]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
