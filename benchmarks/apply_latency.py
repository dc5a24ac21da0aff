#!/usr/bin/env python3
"""Apply-to-running and apply-to-done of a trivial task on an idle local instance, and server start-up.

Starts `corral server` as a process on a free loopback port with a fresh state directory, applies a
fleet, warms one instance with a first task, then applies N trivial tasks one after another, polling
`runs/get` every 5 ms. Prints medians and p90s. Figures, not assertions: run it beside the tests.

    python benchmarks/apply_latency.py [--runs 20]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

FLEET = {
    "type": "fleet",
    "name": "bench",
    "nodes": "0..1",
    "resources": {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."},
}
TASK = {
    "type": "task",
    "commands": ["echo ok"],
    "fleets": ["bench"],
    "resources": {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(state: str, port: int) -> tuple[subprocess.Popen[bytes], float]:
    env = {
        **os.environ,
        "CORRAL_SERVER_DIR": state,
        "CORRAL_CONFIG_DIR": f"{state}/cli",
        "CORRAL_SERVER_ADMIN_TOKEN": "bench",
    }
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral.cli.main", "server", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while True:
        try:
            if httpx.post(f"http://127.0.0.1:{port}/api/server/get_info", timeout=1).status_code == 200:
                return proc, time.perf_counter() - t0
        except httpx.HTTPError:
            time.sleep(0.005)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()


def one_run(c: httpx.Client, name: str) -> tuple[float, float]:
    body = {"force": False, "plan": {"run_spec": {"configuration": {**TASK, "name": name}}}}
    t0 = time.perf_counter()
    r = c.post("/api/project/main/runs/apply", json=body)
    r.raise_for_status()
    running = None
    while True:
        run = c.post("/api/project/main/runs/get", json={"run_name": name}).json()
        status = run["status"]
        now = time.perf_counter() - t0
        if running is None and status in ("running", "terminating", "done"):
            running = now
        if status in ("done", "failed", "terminated"):
            if status != "done":
                raise SystemExit(f"run {name} ended {status}: {run['latest_job_submission']}")
            return running if running is not None else now, now
        time.sleep(0.005)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        proc, cold = start_server(f"{tmp}/state", port)
        stop(proc)
        proc, warm = start_server(f"{tmp}/state", port)
        try:
            with httpx.Client(
                base_url=f"http://127.0.0.1:{port}", headers={"Authorization": "Bearer bench"}, timeout=30
            ) as c:
                fleet = {"force": True, "plan": {"spec": {"configuration": FLEET, "profile": {}}}}
                c.post("/api/project/main/fleets/apply", json=fleet).raise_for_status()
                first_running, first_done = one_run(c, "warmup")
                to_running, to_done = [], []
                for i in range(args.runs):
                    r, d = one_run(c, f"bench-{i}")
                    to_running.append(r)
                    to_done.append(d)
                c.post("/api/project/main/fleets/delete", json={"names": ["bench"]}).raise_for_status()
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    insts = c.post("/api/instances/list", json={}).json()
                    if all(i["status"] == "terminated" for i in insts):
                        break
                    time.sleep(0.1)
        finally:
            stop(proc)
    print(f"machine: {os.cpu_count()} CPUs; {args.runs} runs, sequential, one idle local instance")
    print(f"server start-up to first 200: cold {cold * 1000:.0f} ms, warm {warm * 1000:.0f} ms")
    ms = 1000
    print(f"first run (provisions the instance): running {first_running * ms:.0f} ms, done {first_done * ms:.0f} ms")
    print(
        f"apply-to-running: median {statistics.median(to_running) * ms:.0f} ms, p90 {pct(to_running, 0.9) * ms:.0f} ms"
    )
    print(f"apply-to-done:    median {statistics.median(to_done) * ms:.0f} ms, p90 {pct(to_done, 0.9) * ms:.0f} ms")


if __name__ == "__main__":
    main()
