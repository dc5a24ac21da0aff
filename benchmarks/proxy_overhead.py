#!/usr/bin/env python3
"""The in-server proxy's overhead beside a direct request to the same replica.

Starts a corral server in this process (SQLite, the local backend; the job sandbox when run as root),
applies a one-replica service whose app is a tiny asyncio HTTP/1.1 server answering ``ok``, waits until
it is ready, then a load client in a second process sends GET requests over keep-alive connections:
straight to the replica's port on this machine, then through ``/proxy/services/main/bench/``. Prints
p50/p99 latency at concurrency 1, requests per second at concurrency 16, the proxy's added latency, and
the database statements the server ran per proxied request (beyond what its workers run when idle,
measured over a window of the same length). Figures, not assertions.

    python benchmarks/proxy_overhead.py [--requests 3000]
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.in_process import InProcess, in_process_server
from benchlib.ok_service import load, main, run_client, start_ok_service


# ---- the load client (a second process) ---------------------------------------------------------
async def _client(args: list[str]) -> dict[str, float]:
    url, token, n, conc = args[:4]
    hostport, _, path = url.removeprefix("http://").partition("/")
    host, port = hostport.split(":")
    head = (
        f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nAuthorization: Bearer {token}\r\nUser-Agent: bench\r\n\r\n"
    ).encode()
    return await load(int(port), head, int(n), int(conc), ok=(200, 404), host=host)


# ---- the server (this process) --------------------------------------------------------------------
async def bench(requests: int) -> None:
    async with in_process_server("corral-proxy-bench-", local_cpus=4, local_memory_mib=8192) as srv:
        await _measure(srv, requests)


async def _measure(srv: InProcess, requests: int) -> None:
    import httpx
    from sqlalchemy import event

    settings = srv.settings
    statements = 0

    def count(*_args: Any) -> None:
        nonlocal statements
        statements += 1

    db = srv.prepared.ctx.db
    for engine in {id(e): e for e in (db._read, db._write)}.values():
        event.listen(engine.sync_engine, "before_cursor_execute", count)
    base = srv.url
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": "Bearer bench-token"}, timeout=30) as c:
        sub = await start_ok_service(c)
        host_port = (sub.get("job_runtime_data") or {}).get("ports", {}) or {}
        direct = f"http://127.0.0.1:{host_port.get('8000', 8000)}/"
        proxied = f"{base}/proxy/services/main/bench/"
        results: dict[str, dict[str, float]] = {}
        # the floor: the server answering from the proxy's cache without any upstream (404, no such service)
        floor = f"{base}/proxy/services/main/nosuch/"
        for name, url in (("direct", direct), ("proxy", proxied), ("floor", floor)):
            for conc in (1, 16):
                before = statements
                results[f"{name}@{conc}"] = res = await asyncio.to_thread(
                    run_client, __file__, url, "bench-token", requests, conc
                )
                res["statements"] = statements - before
        # the workers' own statements over a window as long as the proxied runs
        window = results["proxy@1"]["wall_s"] + results["proxy@16"]["wall_s"]
        before = statements
        await asyncio.sleep(window)
        idle = statements - before
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["bench"], "abort": True})

    load = os.getloadavg()[0]
    print(f"proxy overhead ({requests} requests per figure, sandbox={settings.sandbox}, load {load:.2f})")
    print(f"{'path':<10}{'conc':>5}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}")
    for key, res in results.items():
        name, conc = key.split("@")
        print(f"{name:<10}{conc:>5}{res['rps']:>10.0f}{res['p50_ms']:>10.3f}{res['p99_ms']:>10.3f}")
    d1, p1 = results["direct@1"], results["proxy@1"]
    print(f"added at concurrency 1: p50 {p1['p50_ms'] - d1['p50_ms']:.3f} ms, p99 {p1['p99_ms'] - d1['p99_ms']:.3f} ms")
    print(
        f"req/s at concurrency 16: proxy {results['proxy@16']['rps']:.0f} vs direct {results['direct@16']['rps']:.0f}"
    )
    proxied_statements = results["proxy@1"]["statements"] + results["proxy@16"]["statements"]
    n = results["proxy@1"]["requests"] + results["proxy@16"]["requests"]
    print(
        f"database statements: {proxied_statements} during {n:.0f} proxied requests, {idle} in an idle window as long "
        f"-> {(proxied_statements - idle) / n:.4f} per request beyond the workers' own"
    )


if __name__ == "__main__":
    main(__doc__ or "", bench, _client)
