#!/usr/bin/env python3
"""The API, a scheduling pass, start-up and memory with a year of history, beside an empty database.

Three states side by side, each a `corral server` process (SQLite, or one database each on a throwaway Postgres
cluster with ``--postgres``): ``empty`` (made by the server, with a project ``quiet``, a fleet and a run ``probe``
applied through the API), ``filled`` (the same, then a year of history written through the store's tables:
``benchlib/history_fill.py``, ``--runs`` finished runs over 100 projects and 1,000 users, their jobs and
resubmissions, events, 500 fleets with 10,500 instances, 200 running runs, logs and metric samples) and ``live``
(the same fill with no finished run: the accounts, fleets, instances and running runs alone; ``--no-live`` leaves
it out). ``filled / empty`` is what a year of history and the fill's fleets, instances and users cost together;
``filled / live`` is what the finished runs alone cost, the fleets, instances and users being the same on both
sides. Every figure is taken from the states in turn (a request to one, then the same to the others), so that
the machine's load weighs on all alike: start-up (to the first answer, background workers on; 3 starts each),
idle RSS, ``runs/apply`` (8 clients at once, 1,000 runs each, in rounds), then with the workers off (their
passes would be timed with each request) the median of ``--requests`` sequential calls of each case after a
warm-up, the scheduling worker's own ``pass_once`` in this process over the 1,000 queued jobs (a fresh worker
each time) and the database's size.

Prints a table with the machine's load and, with ``--json FILE``, writes ``{"figures": {name: {"empty",
"filled", "unit"}}}`` (with ``"live"`` beside them when measured; and ``"other"``, the cases beyond the named
ones). ``--keep`` keeps the states on SQLite and ``--reuse DIR`` measures a kept one again. Figures, not
assertions.

    python benchmarks/history_scale.py [--runs 1000000] [--postgres] [--requests 50] [--json FILE] [--keep]
                                       [--no-live]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import history_fill
from benchlib.procs import rss_kib
from benchlib.servers import Flavour, Running, start, stop

APPLIES, CLIENTS, APPLY_ROUND = 1000, 8, 25  # 5 rounds of 8 x 25 applies on each server, in turn
#: The names of the JSON's figures, each with its unit and how its ratio is read.
FIGURES = {
    "apply_rps": "req/s",
    "list_p50_ms": "ms",
    "list_project_p50_ms": "ms",
    "get_p50_ms": "ms",
    "events_p50_ms": "ms",
    "metrics_scrape_ms": "ms",
    "pass_ms": "ms",
    "startup_s": "s",
    "idle_rss_mb": "MB",
    "db_mb": "MB",
}
TASK = {"type": "task", "commands": ["python train.py"], "resources": {"cpu": "2..", "memory": "4GB.."}}


@dataclass
class Side:
    """One of the servers measured side by side: its state, its server while it runs, its figures."""

    name: str  # "empty", "live" or "filled"
    flavour: Flavour
    srv: Running | None = None
    figures: dict[str, float] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)
    applied: list[str] = field(default_factory=list)

    @property
    def running(self) -> Running:
        assert self.srv is not None
        return self.srv

    def add(self, name: str, value: float) -> None:
        self.samples.setdefault(name, []).append(value)

    def settle(self) -> None:
        self.figures |= {k: statistics.median(v) for k, v in self.samples.items()}


class ApiOnly(Flavour):
    """corral's server with its background workers off (their passes would be timed with each request), unless
    ``workers`` (start-up is timed with them: their start is on its path), and ``GET /metrics`` on. The AWS price
    catalogue is not fetched (the machine may have no network)."""

    workers = False

    def server_cmd(self, port: int) -> tuple[list[str], dict[str, str]]:
        cmd, env = super().server_cmd(port)
        env.update(CORRAL_BACKGROUND_PROCESSING="1" if self.workers else "0", CORRAL_ENABLE_PROMETHEUS_METRICS="1")
        env.update(CORRAL_AWS_LIVE_CATALOG="off")
        return cmd, env


def _client(srv: Running) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=srv.url, headers={"Authorization": f"Bearer {srv.token}"}, timeout=300)


def _apply_body(name: str | None = None) -> dict[str, Any]:
    return {"force": False, "plan": {"run_spec": {"run_name": name, "configuration": TASK}}}


async def _setup(flavour: Flavour) -> None:
    """A fresh state as both servers have it: a second project, a fleet and a run (``probe``) the history copies."""
    srv = start(flavour)
    try:
        async with _client(srv) as c:
            (await c.post("/api/projects/create", json={"project_name": "quiet"})).raise_for_status()
            fleet = {"type": "fleet", "name": "template-fleet", "nodes": "0..2"}
            body = {"force": True, "plan": {"spec": {"configuration": fleet, "profile": {}}}}
            (await c.post("/api/project/main/fleets/apply", json=body)).raise_for_status()
            (await c.post("/api/project/main/runs/apply", json=_apply_body("probe"))).raise_for_status()
    finally:
        stop(srv)


async def _apply_round(side: Side, per_client: int) -> None:
    """``runs/apply`` from 8 clients at once, ``per_client`` each; its rate is one sample."""
    async with _client(side.running) as c:

        async def client() -> None:
            for _ in range(per_client):
                r = await c.post("/api/project/main/runs/apply", json=_apply_body())
                r.raise_for_status()
                side.applied.append(r.json()["run_spec"]["run_name"])

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(CLIENTS)))
        side.add("apply_rps", CLIENTS * per_client / (time.perf_counter() - t0))


def _cases(c: httpx.AsyncClient, run_id: str) -> list[tuple[str, Callable[[], Awaitable[httpx.Response]]]]:
    def post(path: str, body: dict[str, Any]) -> Callable[[], Awaitable[httpx.Response]]:
        return lambda: c.post(path, json=body)

    return [
        ("list_p50_ms", post("/api/runs/list", {"limit": 100})),
        ("list_project_p50_ms", post("/api/runs/list", {"project_name": "main", "limit": 100})),
        ("list_user_p50_ms", post("/api/runs/list", {"username": "admin", "limit": 100})),
        # ``dstack ps``: a project's active runs (few, among its whole history)
        ("list_active_p50_ms", post("/api/runs/list", {"project_name": "quiet", "only_active": True})),
        ("get_p50_ms", post("/api/project/main/runs/get", {"run_name": "probe"})),
        ("fleets_p50_ms", post("/api/fleets/list", {})),
        ("instances_p50_ms", post("/api/instances/list", {})),
        ("events_p50_ms", post("/api/events/list", {})),
        ("events_run_p50_ms", post("/api/events/list", {"target_runs": [run_id]})),
        ("metrics_job_p50_ms", lambda: c.get("/api/project/main/metrics/job/probe")),
        ("metrics_scrape_ms", lambda: c.get("/metrics")),
        ("ui_runs_p50_ms", lambda: c.get("/runs", headers={"Authorization": ""})),
    ]


async def _ui_session(c: httpx.AsyncClient, token: str) -> None:
    r = await c.post("/login", data={"token": token, "next": "/runs"}, headers={"Origin": str(c.base_url)})
    if r.status_code != 303:
        raise SystemExit(f"the UI's login answered {r.status_code}")


async def _requests(sides: list[Side], requests: int) -> None:
    """Every timed request, the two servers in turn (one request to each, then the next), after warm-ups."""
    clients = [_client(s.running) for s in sides]
    try:
        per_side = []
        for side, c in zip(sides, clients, strict=True):
            await _ui_session(c, side.running.token)
            run_id = (await c.post("/api/project/main/runs/get", json={"run_name": "probe"})).json()["id"]
            per_side.append(_cases(c, run_id))
        for k, (name, _) in enumerate(per_side[0]):
            for cases in per_side:
                for _ in range(3):
                    (await cases[k][1]()).raise_for_status()
            for _ in range(requests):
                for side, cases in zip(sides, per_side, strict=True):
                    t0 = time.perf_counter()
                    r = await cases[k][1]()
                    side.add(name, (time.perf_counter() - t0) * 1000)
                    r.raise_for_status()
    finally:
        for c in clients:
            await c.aclose()


async def _passes(sides: list[Side], repeats: int = 5) -> None:
    """A fresh scheduling worker's pass over each state's queue (the 1,000 applied jobs), in turn (``pass_ms``: a
    restart's), then a kept worker's passes (``pass_warm_ms``: the server's own, on every apply and job end)."""
    from corral.server import prepare
    from corral.settings import Settings
    from corral.workers.scheduling import Scheduling

    prepared = []
    for side in sides:
        f = side.flavour
        assert f.database_url is not None
        settings = Settings.from_env({}, server_dir=f.state, database_url=f.database_url, write_cli_config=False)
        prepared.append(await prepare(settings))
    try:
        for _ in range(repeats):
            for side, p in zip(sides, prepared, strict=True):
                t0 = time.perf_counter()
                await Scheduling(p.ctx).pass_once()
                side.add("pass_ms", (time.perf_counter() - t0) * 1000)
        workers = [Scheduling(p.ctx) for p in prepared]
        for w in workers:
            await w.pass_once()
        for _ in range(4 * repeats):
            for side, w in zip(sides, workers, strict=True):
                t0 = time.perf_counter()
                await w.pass_once()
                side.add("pass_warm_ms", (time.perf_counter() - t0) * 1000)
    finally:
        for p in prepared:
            await p.ctx.db.dispose()


async def _db_mb(flavour: Flavour) -> float:
    if flavour.postgres is None:
        return sum(p.stat().st_size for p in (flavour.state / "data").glob("corral.db*")) / 1e6
    from corral.store.db import Database

    assert flavour.database_url is not None
    db = Database(flavour.database_url)
    try:
        async with db.read() as conn:
            size = (await conn.exec_driver_sql("SELECT pg_database_size(current_database())")).scalar_one()
        return float(size) / 1e6
    finally:
        await db.dispose()


async def measure(sides: list[Side], requests: int) -> None:
    """Both states, each figure taken from the two in turn, so that the machine's load weighs on both alike."""
    for _ in range(3):
        for side in sides:
            side.flavour.workers = True
            srv = start(side.flavour)
            stop(srv)
            side.flavour.workers = False
            side.add("startup_s", srv.startup_s)
    try:
        for side in sides:
            side.srv = start(side.flavour)
        await asyncio.sleep(3.0)
        for side in sides:
            side.add("idle_rss_mb", rss_kib(side.running.proc.pid) / 1024)
        for _ in range(APPLIES // (CLIENTS * APPLY_ROUND)):
            for side in sides:
                await _apply_round(side, APPLY_ROUND)
        await _requests(sides, requests)
    finally:
        for side in sides:
            if side.srv is not None:
                stop(side.srv)
    await _passes(sides)
    for side in sides:
        side.add("db_mb", await _db_mb(side.flavour))
        side.settle()


async def _fill(flavour: Flavour, n: int) -> float:
    from corral.settings import Settings
    from corral.store.db import Database
    from corral.store.encryption import cipher_for, seal

    assert flavour.database_url is not None
    cipher = cipher_for(Settings.from_env({}, server_dir=flavour.state, database_url=flavour.database_url))
    db = Database(flavour.database_url)
    t0 = time.perf_counter()

    def progress(what: str, rows: int, took: float) -> None:
        rate = f"{rows / took:,.0f} rows/s" if took > 0 else ""
        print(f"  filled {what}: {rows:,} in {took:.1f} s {rate}", file=sys.stderr, flush=True)

    try:
        tpl = await history_fill.template(db, "probe", "template-fleet")
        await history_fill.fill(db, tpl, n, progress, lambda token: seal(cipher, token))
    finally:
        await db.dispose()
    return time.perf_counter() - t0


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def report(sides: list[Side], runs: int, fill_s: float, backend: str, load: list[float]) -> dict[str, Any]:
    by = {s.name: s for s in sides}
    empty, filled, live = by["empty"], by["filled"], by.get("live")
    rate = runs / max(fill_s, 1e-9)
    print(f"\n{backend}, {runs:,} finished runs written in {fill_s:.0f} s ({rate:,.0f} runs/s with the rest)")
    print(f"load average (1 min) before and after measuring: {load[0]:.2f}, {load[1]:.2f}; {os.cpu_count()} CPUs")
    head = f"{'figure':<22}{'empty':>12}{'filled':>13}{'filled/empty':>14}"
    print(head + (f"{'live':>13}{'filled/live':>13}" if live else ""))
    units = {k: FIGURES.get(k, "ms") for k in empty.figures}
    for name, unit in units.items():
        e, f = empty.figures[name], filled.figures[name]
        line = f"{name:<22}{e:>9.2f} {unit:<5}{f:>8.2f} {unit:<5}{_ratio(f, e):>9.2f}x"
        if live:
            lv = live.figures[name]
            line += f"{lv:>8.2f} {unit:<5}{_ratio(f, lv):>8.2f}x"
        print(line)

    def figure(k: str, u: str) -> dict[str, Any]:
        return {"empty": empty.figures[k], "filled": filled.figures[k], "unit": u} | (
            {"live": live.figures[k]} if live else {}
        )

    return {
        "figures": {k: figure(k, u) for k, u in FIGURES.items()},
        "other": {k: figure(k, u) for k, u in units.items() if k not in FIGURES},
        "runs": runs,
        "fill_s": fill_s,
        "load": load,
        "database": backend,
    }


def _sides(root: Path, cluster: Any, reuse: bool, live: bool) -> list[Side]:
    sides = []
    for name in ("empty", "live", "filled") if live else ("empty", "filled"):
        flavour = ApiOnly("corral", root / name, postgres=cluster)
        if not (reuse and name != "empty"):
            flavour.fresh()
        if cluster is not None:
            flavour.database_url = cluster.fresh_database(f"history_{name}")
        else:
            flavour.database_url = f"sqlite+aiosqlite:///{flavour.state}/data/corral.db"
        sides.append(Side(name, flavour))
    return sides


async def _stop_queued(side: Side) -> None:
    """Stop the runs an earlier measurement of a kept state left waiting. Their jobs stay in the queue until a
    runs worker ends them (the workers are off), so a measurement of a kept state has a longer queue:
    its ``pass_ms`` is not comparable (the report says so)."""
    srv = start(side.flavour)
    try:
        async with _client(srv) as c:
            while True:
                body = {"project_name": "main", "only_active": True, "limit": 100}
                found = [r for r in (await c.post("/api/runs/list", json=body)).json() if r["status"] == "submitted"]
                if not found:
                    return
                names = {"runs_names": [r["run_spec"]["run_name"] for r in found], "abort": True}
                (await c.post("/api/project/main/runs/stop", json=names)).raise_for_status()
    finally:
        stop(srv)


async def main_async(
    runs: int, postgres: bool, requests: int, json_path: Path | None, keep: bool, reuse: Path | None, live: bool
) -> None:
    root = reuse or Path(tempfile.mkdtemp(prefix="corral-bench-history-"))
    cluster = None
    if postgres:
        from benchlib.postgres import Cluster

        cluster = Cluster()
    try:
        if reuse is not None:
            live = live and (reuse / "live" / "state").is_dir()  # a state kept before the live side was measured
        sides = _sides(root, cluster, reuse is not None, live)
        for side in sides if reuse is None else sides[:1]:
            await _setup(side.flavour)
        fill_s = float("nan")
        for side in sides[1:]:
            if reuse is not None:
                await _stop_queued(side)
            elif side.name == "live":
                print("the live state (the fill with no finished run):", file=sys.stderr, flush=True)
                await _fill(side.flavour, 0)
            else:
                fill_s = await _fill(side.flavour, runs)
        load = [os.getloadavg()[0]]
        await measure(sides, requests)
        load.append(os.getloadavg()[0])
        result = report(sides, runs, fill_s, "Postgres" if postgres else "SQLite", load)
        if reuse is not None:
            print("pass_ms: not comparable on a kept state (its earlier runs' jobs are still queued)")
        if json_path is not None:
            json_path.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        if cluster is not None:
            cluster.stop()  # a cluster is always removed: --keep keeps SQLite's state
        if (keep or reuse is not None) and cluster is None:
            print(f"states kept in {root}", file=sys.stderr)
        else:
            import shutil

            shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--runs", type=int, default=1_000_000, help="finished runs of history (default 1,000,000)")
    p.add_argument("--postgres", action="store_true", help="a throwaway Postgres cluster instead of SQLite")
    p.add_argument("--requests", type=int, default=50, help="sequential requests per figure (their median)")
    p.add_argument("--keep", action="store_true", help="keep the server's state directory (printed) for inspection")
    p.add_argument(
        "--reuse",
        type=Path,
        default=None,
        metavar="DIR",
        help="measure again the filled state a --keep run left in DIR (SQLite; --runs then only labels it)",
    )
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the figures as JSON")
    p.add_argument(
        "--no-live",
        dest="live",
        action="store_false",
        help="leave out the third state (the same fleets, instances, users and running runs, no finished run)",
    )
    a = p.parse_args()
    if a.reuse is not None and (a.postgres or not (a.reuse / "filled" / "state").is_dir()):
        p.error("--reuse takes the directory a --keep run on SQLite printed")
    if a.runs < 0:
        p.error("--runs must be 0 (the fleets, instances, users and projects alone) or more")
    asyncio.run(main_async(a.runs, a.postgres, a.requests, a.json, a.keep, a.reuse, a.live))


if __name__ == "__main__":
    main()
