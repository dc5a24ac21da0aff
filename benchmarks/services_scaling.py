#!/usr/bin/env python3
"""Services II's figures: scale from zero, and requests lost during a rollout.

Starts a corral server in this process (SQLite, the local backend; the job sandbox when run as root) with
a short scaling window and drain, and a fleet on this machine.

* **From zero**: a ``0..1`` service whose app waits ``--startup`` seconds before it listens (a model
  loading). The first request is sent while it has no replica; the time until it is answered, minus the
  app's own start-up (from its process start to listening, which it reports), is corral's part: the
  scale-up, placing and starting the replica, the probe that finds it ready, and the held request sent
  on. Repeated ``--rounds`` times, each after the service went back to zero.
* **Rollout**: a two-replica service re-applied with a changed ``env`` while ``--clients`` clients send
  requests one after another; the requests that did not get a 200, out of all sent, and how long the
  rollout took.

Progress goes to stderr; a stage stuck for two minutes stops the script and says where. Figures, not
assertions.

    python benchmarks/services_scaling.py [--rounds 3] [--startup 1.0] [--clients 4]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.in_process import in_process_server

APP = b"""
import os, sys, time, json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
START = time.time()
time.sleep(float(os.environ.get("STARTUP", "0")))
LISTEN = None
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def do_GET(self):
        body = json.dumps({"start": START, "listen": LISTEN, "version": os.environ.get("VERSION")}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
ThreadingHTTPServer.daemon_threads = True
s = ThreadingHTTPServer(("0.0.0.0", 8000), H)
LISTEN = time.time()
s.serve_forever()
"""


#: A stage that takes longer than this has failed: the script says where it was and stops.
WAIT_LIMIT = 120.0


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def conf(name: str, replicas: Any, startup: float, version: str = "1", **extra: Any) -> dict[str, Any]:
    app = base64.b64encode(APP).decode()
    return {
        "type": "service",
        "name": name,
        "port": 8000,
        "commands": [f"echo {app} | base64 -d > app.py", "exec python3 app.py"],
        "env": {"STARTUP": str(startup), "VERSION": version},
        "resources": {"cpu": "1..", "memory": "0.1GB.."},
        "probes": [{"type": "http", "url": "/", "interval": "1s"}],
        "replicas": replicas,
        **extra,
    }


async def _active(c: Any, name: str) -> list[dict[str, Any]]:
    run = (await c.post("/api/project/main/runs/get", json={"run_name": name})).json()
    subs = [j["job_submissions"][-1] for j in run["jobs"]]
    return [s for s in subs if s["status"] not in ("terminated", "failed", "aborted", "done")]


async def from_zero(c: Any, rounds: int, startup: float) -> list[tuple[float, float]]:
    scaling = {"metric": "rps", "target": 100, "scale_up_delay": "1s", "scale_down_delay": "1s"}
    body = {"force": False, "plan": {"run_spec": {"configuration": conf("cold", "0..1", startup, scaling=scaling)}}}
    (await c.post("/api/project/main/runs/apply", json=body)).raise_for_status()
    out = []
    for i in range(rounds):
        say(f"from zero, round {i + 1}: waiting for 0 replicas")
        began = time.monotonic()
        while await _active(c, "cold"):  # back at zero
            if time.monotonic() - began > WAIT_LIMIT:
                raise SystemExit(f"the service did not scale back to zero within {WAIT_LIMIT:.0f} s")
            await asyncio.sleep(0.2)
        say("sending the first request")
        t0 = time.time()
        r = await c.get("/proxy/services/main/cold/", timeout=120)
        t1 = time.time()
        r.raise_for_status()
        own = r.json()["listen"] - r.json()["start"]
        out.append((t1 - t0, own))
        say(f"answered after {t1 - t0:.2f} s")
    await c.post("/api/project/main/runs/stop", json={"runs_names": ["cold"], "abort": True})
    return out


async def rollout(c: Any, clients: int) -> tuple[int, int, float]:
    async def apply(version: str) -> dict[str, Any]:
        configuration = conf("roll", 2, 0.0, version)
        plan = (
            await c.post("/api/project/main/runs/get_plan", json={"run_spec": {"configuration": configuration}})
        ).json()
        body = {"plan": {"run_spec": plan["run_spec"], "current_resource": plan["current_resource"]}, "force": False}
        r = await c.post("/api/project/main/runs/apply", json=body)
        r.raise_for_status()
        return dict(r.json())

    run: dict[str, Any] = {}

    async def serving(deployment: int) -> None:
        nonlocal run
        last, began = 0.0, time.monotonic()
        while True:
            if time.monotonic() - began > WAIT_LIMIT:
                why = run.get("status_message")
                raise SystemExit(f"deployment {deployment} not serving after {WAIT_LIMIT:.0f} s: {why!r}")
            run = (await c.post("/api/project/main/runs/get", json={"run_name": "roll"})).json()
            subs = [j["job_submissions"][-1] for j in run["jobs"]]
            if time.monotonic() - last > 5:
                last = time.monotonic()
                state = [
                    (s["deployment_num"], s["status"], s.get("corral_ready"), s.get("status_message")) for s in subs
                ]
                say(f"waiting for deployment {deployment}: {run['status']} {run.get('status_message')!r} {state}")
            ready = [
                s
                for s in subs
                if s["status"] == "running" and s.get("corral_ready") and s["deployment_num"] == deployment
            ]
            live = [s for s in subs if s["status"] not in ("terminated", "failed", "aborted", "done")]
            if len(ready) == 2 and len(live) == 2:
                return
            await asyncio.sleep(0.2)

    say("rollout: applying version 1")
    await apply("1")
    await serving(0)
    say("version 1 serving; starting clients")
    stop = False
    sent = [0]
    failed = [0]

    async def client() -> None:
        while not stop:
            sent[0] += 1
            try:
                r = await c.get("/proxy/services/main/roll/")
                if r.status_code != 200:
                    failed[0] += 1
            except Exception:
                failed[0] += 1

    tasks = [asyncio.create_task(client()) for _ in range(clients)]
    await asyncio.sleep(1.0)
    t0 = time.monotonic()
    await apply("2")
    say("version 2 applied")
    await serving(1)
    say("version 2 serving")
    took = time.monotonic() - t0
    await asyncio.sleep(1.0)
    stop = True
    await asyncio.gather(*tasks)
    await c.post("/api/project/main/runs/stop", json={"runs_names": ["roll"], "abort": True})
    return sent[0], failed[0], took


async def bench(rounds: int, startup: float, clients: int, drain: float) -> None:
    import httpx

    overrides = {
        "local_cpus": 8,
        "local_max_instances": 4,
        "local_memory_mib": 8 * 8192,
        "local_blocks": 8,
        "service_scaling_window": 2.0,
        "service_drain_timeout": drain,
        "service_scaling_tick": 0.2,
    }
    async with in_process_server("corral-services-bench-", **overrides) as srv:
        headers = {"Authorization": f"Bearer {srv.token}"}
        async with httpx.AsyncClient(base_url=srv.url, headers=headers, timeout=60) as c:
            fleet = {"type": "fleet", "name": "bench", "nodes": "0..4", "resources": {"cpu": "1.."}}
            await c.post(
                "/api/project/main/fleets/apply",
                json={"force": False, "plan": {"spec": {"configuration": fleet, "profile": {}}}},
            )
            cold = await from_zero(c, rounds, startup)
            sent, failed, took = await rollout(c, clients)
    print(f"from zero ({rounds} rounds, the app's own start-up {startup:.1f} s):")
    for total, own in cold:
        print(f"  first request answered after {total:.2f} s; app start-up {own:.2f} s; corral {total - own:.2f} s")
    print(f"  corral's part, median: {statistics.median(t - o for t, o in cold):.2f} s")
    print(
        f"rollout of 2 replicas under {clients} clients (drain timeout {drain:.0f} s): "
        f"{failed} of {sent} requests lost; took {took:.1f} s"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--startup", type=float, default=1.0)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--drain", type=float, default=30.0, help="CORRAL_SERVICE_DRAIN_TIMEOUT (the default: 30)")
    a = p.parse_args()
    asyncio.run(bench(a.rounds, a.startup, a.clients, a.drain))


if __name__ == "__main__":
    main()
