#!/usr/bin/env python3
"""corral vs the real dstack 0.22.5 server, on this machine, in one run: start-up, memory, runs/apply,
runs/list, fleets, and the CLIs. Prints one table (figure, corral, dstack, ratio, target) of medians
over the repeats.

    python benchmarks/vs_dstack.py                      # everything (~10 min on 2 cores)
    python benchmarks/vs_dstack.py --no-dstack          # corral only
    python benchmarks/vs_dstack.py --only start,cli     # a subset: start apply list fleets cli local
    python benchmarks/vs_dstack.py --postgres           # both servers on a throwaway PostgreSQL cluster

Run it with the interpreter corral is installed in (the dev venv or .venv): the corral server and CLI
are started as ``sys.executable -m corral.cli.main``. dstack[server]==0.22.5 is installed once into
its own virtualenv (``--dstack-venv``, default ~/.cache/corral-bench/dstack-server-0.22.5). Both
servers get fresh state in a temporary directory and free loopback ports; the same httpx load
generator (asyncio, 8 concurrent workers) drives both. Figures, not assertions: not part of CI.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib.servers import (
    DEFAULT_DSTACK_VENV,
    DSTACK_VERSION,
    BenchError,
    Flavour,
    ensure_dstack_venv,
    prime_bytecode,
)
from benchlib.workloads import WORKLOADS, Bench, Options, Results, interleave

# key, label, unit, better ("lo"/"hi"), target advantage (None = no target)
ROWS: list[tuple[str, str, str, str, float | None]] = [
    ("start_cold_s", "start-up, fresh state (launch to first 200)", "s", "lo", None),
    ("start_warm_s", "start-up, existing state", "s", "lo", 4),
    ("stop_s", "shutdown (SIGTERM to exit)", "s", "lo", None),
    ("rss_idle_mb", "idle RSS, server process", "MB", "lo", 2),
    ("idle_cpu_pct", "idle CPU, server process (% of a core)", "%", "lo", None),
    ("rss_peak_mb", "peak RSS during the workloads (sampled)", "MB", "lo", None),
    ("rss_hwm_mb", "peak RSS, kernel high-water mark", "MB", "lo", None),
    ("apply_rps", "runs/apply, {requests} requests, {concurrency} clients", "req/s", "hi", 10),
    ("apply_p50", "runs/apply p50", "ms", "lo", None),
    ("apply_p99", "runs/apply p99", "ms", "lo", 10),
    ("apply_cpu_ms", "runs/apply: server CPU per request (incl. its background work)", "ms", "lo", None),
    ("apply_drain_s", "runs/apply: all runs failed (no fleet), after the last apply", "s", "lo", None),
    ("list_rps", "runs/list, 100 of {requests} runs", "req/s", "hi", 10),
    ("list_p50", "runs/list p50", "ms", "lo", None),
    ("list_p99", "runs/list p99", "ms", "lo", None),
    ("list_cpu_ms", "runs/list: server CPU per request", "ms", "lo", None),
    ("ps_rps", "runs/list, `dstack ps` body (only_active)", "req/s", "hi", None),
    ("ps_p50", "runs/list `ps` body p50", "ms", "lo", None),
    ("ps_p99", "runs/list `ps` body p99", "ms", "lo", None),
    ("fleet_apply_rps", "fleets/apply, {fleets} requests, {concurrency} clients", "req/s", "hi", None),
    ("fleet_apply_p50", "fleets/apply p50", "ms", "lo", None),
    ("fleet_apply_p99", "fleets/apply p99", "ms", "lo", None),
    ("fleet_list_rps", "fleets/list, {fleets} fleets", "req/s", "hi", None),
    ("fleet_list_p50", "fleets/list p50", "ms", "lo", None),
    ("fleet_list_p99", "fleets/list p99", "ms", "lo", None),
    ("cli_help_s", "CLI `--help`", "s", "lo", 5),
    ("cli_ps_s", "CLI `ps` ({cli_runs} finished runs in the project)", "s", "lo", None),
    ("cli_ps_all_s", "CLI `ps -a` (up to 100 of them shown)", "s", "lo", None),
    ("local_apply_rps", "[local fleet] runs/apply, {requests} requests, {concurrency} clients", "req/s", "hi", None),
    ("local_apply_p50", "[local fleet] runs/apply p50", "ms", "lo", None),
    ("local_apply_p99", "[local fleet] runs/apply p99", "ms", "lo", None),
    ("local_list_rps", "[local fleet] runs/list, 100 of {requests} queued runs", "req/s", "hi", None),
    ("local_list_p99", "[local fleet] runs/list p99", "ms", "lo", None),
    ("local_ps_rps", "[local fleet] runs/list `ps` body (100 active)", "req/s", "hi", None),
    ("local_ps_p99", "[local fleet] runs/list `ps` body p99", "ms", "lo", None),
    ("local_first_done_s", "[local fleet] first run done (job sleeps 6 s), after the first apply", "s", "lo", None),
    ("local_server_peak_mb", "[local fleet] peak RSS, server process", "MB", "lo", None),
    ("local_agents_mb", "[local fleet] RSS of the agents (+ their jobs)", "MB", "lo", None),
    ("local_agents", "[local fleet] agent processes", "", "lo", None),
]


def fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "—"
    if unit in ("s",):
        return f"{v:.2f} s"
    if unit == "ms":
        return f"{v:.1f} ms" if v < 10 else f"{v:.0f} ms"
    if unit == "req/s":
        return f"{v:.1f}" if v < 100 else f"{v:.0f}"
    if unit == "%":
        return f"{v:.1f} %"
    if unit == "MB":
        return f"{v:.0f} MB"
    return f"{v:g}"


def med(res: Results, key: str) -> float | None:
    vals = res.get(key)
    return statistics.median(vals) if vals else None


def machine() -> dict[str, str]:
    mem_kib = 0
    model = platform.processor()
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "cores": str(os.cpu_count()),
        "memory": f"{mem_kib / 1024 / 1024:.1f} GiB",
        "cpu": model,
        "python": platform.python_version(),
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def table(corral: Results, dstack: Results | None, opts: Options, only: set[str], markdown: bool) -> str:
    head = ["figure", "corral", f"dstack {DSTACK_VERSION}", "ratio", "target"]
    rows: list[list[str]] = []
    labels = {**vars(opts), "cli_runs": opts.requests if only & {"apply", "list"} else 0}
    for key, label, unit, better, target in ROWS:
        c, d = med(corral, key), (med(dstack, key) if dstack is not None else None)
        if c is None and d is None:
            continue
        ratio, verdict = "", ""
        if c is not None and d is not None and c > 0 and d > 0:
            adv = c / d if better == "hi" else d / c
            ratio = f"{adv:.1f}× {'more' if better == 'hi' else 'less'}" if adv >= 1 else f"{1 / adv:.1f}× worse"
            if target is not None:
                verdict = f"{'≥' if better == 'hi' else '≤1/'}{target:g}{'×' if better == 'hi' else ''}: "
                verdict += "met" if adv >= target else f"MISSED ({adv:.1f}×)"
        elif target is not None:
            verdict = f"{'≥' if better == 'hi' else '≤1/'}{target:g}{'×' if better == 'hi' else ''}"
        unit_label = f" ({unit})" if unit in ("req/s",) else ""
        rows.append([label.format(**labels) + unit_label, fmt(c, unit), fmt(d, unit), ratio, verdict])
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(out)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([line.format(*head), line.format(*("-" * w for w in widths)), *(line.format(*r) for r in rows)])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(WORKLOADS), help=f"comma-separated subset of: {' '.join(WORKLOADS)}")
    p.add_argument("--no-dstack", action="store_true", help="measure corral only")
    p.add_argument("--repeats", type=int, default=3, help="repeats of each workload (medians are reported)")
    p.add_argument("--requests", type=int, default=500, help="runs/apply requests per repeat")
    p.add_argument("--list-requests", type=int, default=200, help="requests per repeat of each list workload")
    p.add_argument("--fleets", type=int, default=100, help="fleets/apply requests per repeat")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--dstack-venv", type=Path, default=DEFAULT_DSTACK_VENV)
    p.add_argument("--json", type=Path, help="also write all raw figures and medians to this file")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (server logs)")
    p.add_argument(
        "--postgres",
        action="store_true",
        help="both servers on PostgreSQL (a throwaway cluster, one database each) instead of SQLite",
    )
    args = p.parse_args()
    only = {w.strip() for w in args.only.split(",") if w.strip()}
    if unknown := only - set(WORKLOADS):
        p.error(f"unknown workloads: {', '.join(sorted(unknown))} (choose from {', '.join(WORKLOADS)})")
    if importlib.util.find_spec("corral") is None:
        p.error(f"corral is not importable from {sys.executable}; run this with corral's virtualenv")
    opts = Options(args.repeats, args.requests, args.list_requests, args.fleets, args.concurrency)
    t0 = time.perf_counter()
    load0 = " ".join(f"{x:.2f}" for x in os.getloadavg())
    cluster = None
    try:
        venv = None if args.no_dstack else ensure_dstack_venv(args.dstack_venv.expanduser())
        tmp = Path(tempfile.mkdtemp(prefix="corral-bench-"))
        primed = prime_bytecode(tmp / "corral-prime")
        if primed:
            print(
                "corral: PYTHONDONTWRITEBYTECODE is set here; corral's processes use a bytecode cache of their own "
                "(an installed corral has its bytecode, as dstack's virtualenv has)",
                file=sys.stderr,
            )
        if args.postgres:
            from benchlib.postgres import Cluster

            cluster = Cluster()
        benches = [Bench(Flavour("corral", tmp / "corral", postgres=cluster), opts, only)]
        if venv is not None:
            benches.append(Bench(Flavour("dstack", tmp / "dstack", venv, postgres=cluster), opts, only))
        try:
            interleave(benches)
        finally:
            if cluster is not None:
                cluster.stop()
        corral = benches[0].res
        dstack: Results | None = benches[1].res if venv is not None else None
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    took = time.perf_counter() - t0
    m = machine()
    print(
        f"\nmachine: {m['cores']} cores ({m['cpu']}), {m['memory']}; Python {m['python']}; {m['date']}; "
        f"medians of {opts.repeats} repeats; {opts.concurrency} concurrent clients; took {took:.0f} s; "
        f"load average {load0} at the start, {m['load']} at the end"
        + ("; corral with a bytecode cache of its own (PYTHONDONTWRITEBYTECODE is set here)" if primed else "")
        + ("; both servers on PostgreSQL" if args.postgres else "; both servers on SQLite")
    )
    print(table(corral, dstack, opts, only, args.markdown))
    if args.json:
        data = {"machine": m, "options": vars(opts), "took_s": took, "corral": corral, "dstack": dstack}
        args.json.write_text(json.dumps(data, indent=1))
    if args.keep:
        print(f"logs and state: {tmp}", file=sys.stderr)
    else:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
