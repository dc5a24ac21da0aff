#!/usr/bin/env python3
"""Attach latency and SSH round trips through corral's SSH endpoint, with the official dstack 0.22.5 CLI.

Starts ``corral server`` as a process (the e2e tests' harness), applies a fleet and warms one instance, then

* **apply → first log line:** ``dstack apply -y`` (attached) of a task whose first command prints a line,
  timed from the CLI's start to that line on its stdout (the CLI's own plan, submit, wait for ``running``,
  tunnel and ``/logs_ws``), N times;
* **``ssh <run> true``:** with ``dstack attach`` holding a running task, N runs of plain OpenSSH through the
  entries the CLI wrote (two hops: ``<run>-host``, then ``<run>``; a fresh connection each time).

Prints medians and p90s; figures, not assertions. Needs root when the server sandboxes jobs (the default
as root) and OpenSSH's client.

    python benchmarks/attach_latency.py [--runs 10]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from dstack_client_env import DstackCli, cli_env, client_venv, corral_server  # noqa: E402

RESOURCES = "resources:\n  cpu: 1..\n  memory: 0.1GB..\n  disk: 1GB..\n"
TOKEN = "bench-attach-token-0123456789"


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def first_line_latency(cli: DstackCli, name: str) -> float:
    cli.write(f"{name}.yml", f"type: task\nname: {name}\ncommands:\n  - echo first-line-{name}\n{RESOURCES}")
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [str(cli.venv / "bin" / "dstack"), "apply", "-f", f"{name}.yml", "-y"],
        cwd=cli.workdir, env=cli_env(cli.home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    seen = None
    for line in proc.stdout:
        if seen is None and f"first-line-{name}" in line:
            seen = time.perf_counter() - t0
    if proc.wait(120) != 0 or seen is None:
        raise SystemExit(f"attached apply of {name} failed (exit {proc.returncode})")
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    venv = client_venv()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with corral_server(tmp, TOKEN) as server:
            home, work = tmp / "home", tmp / "work"
            home.mkdir()
            work.mkdir()
            cli = DstackCli(venv, home, work, server)
            cli.ok("project", "add", "--name", "main", "--url", server.url, "--token", TOKEN, "-y")
            cli.write("fleet.yml", f"type: fleet\nname: bench\nnodes: 0..1\n{RESOURCES}")
            cli.ok("apply", "-f", "fleet.yml", "-y")
            first_line_latency(cli, "warmup")
            firsts = [first_line_latency(cli, f"first-{i}") for i in range(args.runs)]

            cli.write("hold.yml", f"type: task\nname: hold\ncommands:\n  - sleep 3600\n{RESOURCES}")
            cli.ok("apply", "-f", "hold.yml", "-y", "-d")
            while server.api("/api/project/main/runs/get", {"run_name": "hold"}).json()["status"] != "running":
                time.sleep(0.1)
            attach = subprocess.Popen(
                [str(venv / "bin" / "dstack"), "attach", "hold"], cwd=work, env=cli_env(home),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
            )  # fmt: skip
            assert attach.stdout is not None
            for line in attach.stdout:
                if "Press Ctrl+C" in line:
                    break
            ssh = ["ssh", "-F", str(home / ".ssh" / "config"), "-o", "BatchMode=yes", "hold", "true"]
            trips = []
            for _ in range(args.runs + 1):
                t0 = time.perf_counter()
                subprocess.run(ssh, check=True, capture_output=True, env=cli_env(home), timeout=60)
                trips.append(time.perf_counter() - t0)
            trips = trips[1:]  # the first pays for OpenSSH's own start-up caches
            attach.send_signal(signal.SIGINT)
            attach.wait(30)
            cli.run("stop", "hold", "-y")
            cli.run("fleet", "delete", "bench", "-y")
    load = os.getloadavg()[0]
    print(f"load average (1 min): {load:.2f}; runs: {args.runs}")
    print(
        f"attached dstack apply -> first log line: median {statistics.median(firsts):.2f} s, "
        f"p90 {pct(firsts, 0.9):.2f} s"
    )
    print(f"ssh <run> true (two hops, new connection): median {statistics.median(trips) * 1000:.0f} ms, "
          f"p90 {pct(trips, 0.9) * 1000:.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
