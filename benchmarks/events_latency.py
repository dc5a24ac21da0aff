#!/usr/bin/env python3
"""``events/list`` latency as the history grows: 10,000 then 100,000 events.

Starts `corral server` as a process with fresh state (SQLite, or Postgres with ``--postgres``), makes 4
more projects and a user who is a member of one, then writes synthetic events straight into the database
-- as the recorder writes them: spread over the 5 projects, their fleets, instances, runs and jobs, by
users and the system -- and times R sequential `events/list` calls per case: the admin's latest page,
dstack's CLI default (``within_projects``), one run's events (``target_runs``), a run and its jobs
(``within_runs``), a project's jobs (``include_target_types``), the system's (``actors: [null]``), a page
deep in the history (keyset), and the member's view (only their project's events and their own). Prints
medians and 99th percentiles. Figures, not assertions.

    python benchmarks/events_latency.py [--requests 100] [--postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.load import pct
from benchlib.servers import free_port

SIZES = (10_000, 100_000)
PROJECTS = 5
RUNS_PER_PROJECT = 200


def _entities(project_ids: list[str]) -> list[dict[str, Any]]:
    """Targets of the synthetic history: per project a few fleets with instances, runs with jobs."""
    out = []
    for pid in project_ids:
        out.append({"entity_type": "project", "entity_project_id": pid, "entity_id": pid, "entity_name": "p"})
        for f in range(4):
            fid = str(uuid.uuid4())
            out.append({"entity_type": "fleet", "entity_project_id": pid, "entity_id": fid, "entity_fleet_id": fid})
            for i in range(4):
                out.append(
                    {
                        "entity_type": "instance",
                        "entity_project_id": pid,
                        "entity_id": str(uuid.uuid4()),
                        "entity_fleet_id": fid,
                        "entity_name": f"f{f}-{i}",
                    }
                )
        for r in range(RUNS_PER_PROJECT):
            rid = str(uuid.uuid4())
            out.append(
                {
                    "entity_type": "run",
                    "entity_project_id": pid,
                    "entity_id": rid,
                    "entity_run_id": rid,
                    "entity_name": f"run-{r}",
                }
            )
            for j in range(2):
                out.append(
                    {
                        "entity_type": "job",
                        "entity_project_id": pid,
                        "entity_id": str(uuid.uuid4()),
                        "entity_run_id": rid,
                        "entity_name": f"run-{r}-0-{j}",
                    }
                )
    return out


async def _fill(url: str, entities: list[dict[str, Any]], actors: list[str | None], n: int, start: float) -> None:
    """``n`` more events, one or two targets each, recorded a millisecond apart from ``start`` on."""
    from corral.store.db import Database
    from corral.store.tables import event_targets, events

    db = Database(url)
    rng = random.Random(n)
    try:
        for chunk in range(0, n, 5000):
            evs, tgs = [], []
            for k in range(chunk, min(n, chunk + 5000)):
                eid, at = str(uuid.uuid4()), round(start + k * 0.001, 6)
                evs.append(
                    {
                        "id": eid,
                        "message": "Job status changed RUNNING -> DONE",
                        "recorded_at": at,
                        "actor_user_id": rng.choice(actors),
                    }
                )
                for t in rng.sample(entities, 1 if k % 3 else 2):
                    tgs.append(
                        {
                            "entity_name": "x",
                            "entity_run_id": None,
                            "entity_fleet_id": None,
                            **t,
                            "event_id": eid,
                            "recorded_at": at,
                        }
                    )
            async with db.write() as conn:
                await conn.execute(events.insert(), evs)
                await conn.execute(event_targets.insert(), tgs)
        if not db.is_sqlite:
            async with db.write() as conn:
                await conn.exec_driver_sql("ANALYZE events")
                await conn.exec_driver_sql("ANALYZE event_targets")
    finally:
        await db.dispose()


async def _timed(c: httpx.AsyncClient, body: dict[str, Any], n: int) -> tuple[list[float], int]:
    out, got = [], 0
    for _ in range(n):
        t = time.perf_counter()
        r = await c.post("/api/events/list", json=body)
        out.append(time.perf_counter() - t)
        r.raise_for_status()
        got = len(r.json())
    return out, got


async def main_async(n_requests: int, postgres: bool) -> None:
    port = free_port()
    cluster = None
    with tempfile.TemporaryDirectory() as tmp:
        db_url = f"sqlite+aiosqlite:///{tmp}/state/data/corral.db"
        if postgres:
            from benchlib.postgres import Cluster

            cluster = Cluster()
            db_url = cluster.fresh_database("events_bench")
        env = {
            **os.environ,
            "CORRAL_SERVER_DIR": f"{tmp}/state",
            "CORRAL_CONFIG_DIR": f"{tmp}/cli",
            "CORRAL_SERVER_ADMIN_TOKEN": "bench",
            "CORRAL_DATABASE_URL": db_url,
            "CORRAL_BACKGROUND_PROCESSING": "0",
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "corral.cli.main", "server", "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        rows: list[tuple[int, str, list[float], int]] = []
        try:
            url = f"http://127.0.0.1:{port}"
            async with httpx.AsyncClient(base_url=url, headers={"Authorization": "Bearer bench"}, timeout=60) as c:
                while True:
                    try:
                        await c.get("/healthcheck")
                        break
                    except httpx.HTTPError:
                        await asyncio.sleep(0.05)
                admin_id = (await c.post("/api/users/get_my_user")).json()["id"]
                for i in range(1, PROJECTS):
                    (await c.post("/api/projects/create", json={"project_name": f"p{i}"})).raise_for_status()
                user = (await c.post("/api/users/create", json={"username": "reader", "global_role": "user"})).json()
                members = {"members": [{"username": "reader", "project_role": "user"}]}
                (await c.post("/api/projects/p1/add_members", json=members)).raise_for_status()
                token = (await c.post("/api/users/get_user", json={"username": "reader"})).json()["creds"]["token"]
                projects = {p["project_name"]: p["project_id"] for p in (await c.post("/api/projects/list")).json()}
                entities = _entities(list(projects.values()))
                run = next(e for e in entities if e["entity_type"] == "run")
                main_id = projects["main"]
                filled, start = 0, time.time() - 86400
                for size in SIZES:
                    await _fill(db_url, entities, [None, admin_id, user["id"]], size - filled, start + filled * 0.001)
                    filled = size
                    middle = (
                        await c.post(
                            "/api/events/list",
                            json={"limit": 1, "ascending": True, "prev_recorded_at": _iso(start + size * 0.0005)},
                        )
                    ).json()[0]
                    cases: list[tuple[str, dict[str, Any], str]] = [
                        ("admin, latest page", {}, "bench"),
                        ("within_projects=[main] (dstack event)", {"within_projects": [main_id]}, "bench"),
                        ("target_runs=[one run]", {"target_runs": [run["entity_id"]]}, "bench"),
                        ("within_runs=[one run]", {"within_runs": [run["entity_id"]]}, "bench"),
                        (
                            "include_target_types=[job] in main",
                            {"within_projects": [main_id], "include_target_types": ["job"]},
                            "bench",
                        ),
                        ("actors=[null]", {"actors": [None]}, "bench"),
                        (
                            "a page in the middle (keyset)",
                            {"prev_recorded_at": middle["recorded_at"], "prev_id": middle["id"]},
                            "bench",
                        ),
                        ("a member (1 of 5 projects visible)", {}, token),
                    ]
                    for label, body, who in cases:
                        headers = {"Authorization": f"Bearer {who}"}
                        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as cc:
                            await _timed(cc, body, 5)  # warm-up
                            lat, got = await _timed(cc, body, n_requests)
                        rows.append((size, label, lat, got))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            if cluster is not None:
                cluster.stop()
    print(
        f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; {'Postgres' if postgres else 'SQLite'}; "
        f"{n_requests} sequential events/list per case (limit 100)"
    )
    for size, label, lat, got in rows:
        print(
            f"{size:>7} events  {label:<40} p50 {pct(lat, 0.5) * 1000:6.1f} ms  p99 {pct(lat, 0.99) * 1000:6.1f} ms"
            f"  ({got} events)"
        )


def _iso(ts: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--postgres", action="store_true", help="on a throwaway Postgres cluster instead of SQLite")
    args = p.parse_args()
    asyncio.run(main_async(args.requests, args.postgres))


if __name__ == "__main__":
    main()
