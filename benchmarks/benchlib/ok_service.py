"""The service the proxy benchmarks measure through (``proxy_overhead.py``, ``gateway_hop.py``): a one-replica
service on a one-node fleet of the local backend whose app is a tiny asyncio HTTP/1.1 server answering ``ok``
(:func:`start_ok_service` applies it and waits until it is ready), and the load client they run in a second
process: GET requests over keep-alive connections, latencies and requests per second (:func:`load`, started by
:func:`run_client`), and their command line (:func:`main`)."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

APP = b"""
import asyncio
BODY = b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\nContent-Type: text/plain\\r\\n\\r\\nok"
async def serve(r, w):
    try:
        while True:
            await r.readuntil(b"\\r\\n\\r\\n")
            w.write(BODY)
    except Exception:
        w.close()
async def main():
    s = await asyncio.start_server(serve, "0.0.0.0", 8000)
    await s.serve_forever()
asyncio.run(main())
"""


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def start_ok_service(c: Any, timeout: float = 120.0) -> dict[str, Any]:
    """Apply the fleet ``bench`` and the service ``bench`` with ``c`` (an ``httpx.AsyncClient`` on the server, with
    a token) and wait until its replica is ready; its job's latest submission (``runs/get``'s)."""
    app = base64.b64encode(APP).decode()
    fleet = {"type": "fleet", "name": "bench", "nodes": "0..1", "resources": {"cpu": "1.."}}
    await c.post(
        "/api/project/main/fleets/apply",
        json={"force": False, "plan": {"spec": {"configuration": fleet, "profile": {}}}},
    )
    conf = {
        "type": "service", "name": "bench", "port": 8000,
        "commands": [f"echo {app} | base64 -d > app.py", "exec python3 app.py"],
        "resources": {"cpu": "1..", "memory": "0.1GB.."},
    }  # fmt: skip
    r = await c.post(
        "/api/project/main/runs/apply", json={"force": False, "plan": {"run_spec": {"configuration": conf}}}
    )
    r.raise_for_status()
    deadline = time.monotonic() + timeout
    while True:
        run = (await c.post("/api/project/main/runs/get", json={"run_name": "bench"})).json()
        sub: dict[str, Any] = run["jobs"][0]["job_submissions"][-1]
        if sub["status"] == "running" and sub.get("corral_ready"):
            return sub
        if time.monotonic() > deadline or run["status"] in ("failed", "terminated"):
            why = sub.get("termination_reason_message")
            raise SystemExit(f"the service did not become ready: {run['status']} {sub['status']} {why}")
        await asyncio.sleep(0.2)


async def _worker(host: str, port: int, head: bytes, n: int, out: list[float], ok: Collection[int]) -> None:
    from corral.backends.http1 import iter_body, read_response

    reader, writer = await asyncio.open_connection(host, port)
    for _ in range(n):
        t0 = time.perf_counter()
        writer.write(head)
        resp = await read_response(reader, "GET")
        async for _chunk in iter_body(reader, resp):
            pass
        if resp.status not in ok:
            raise SystemExit(f"HTTP {resp.status}")
        out.append(time.perf_counter() - t0)
    writer.close()


async def load(
    port: int, head: bytes, requests: int, concurrency: int, ok: Collection[int] = (200,), host: str = "127.0.0.1"
) -> dict[str, float]:
    """``requests`` sends of ``head`` to ``host:port`` over ``concurrency`` keep-alive connections, after 200 to warm
    up: requests per second, p50 and p99 latency (ms), the wall time and the count. An answer not in ``ok`` ends it."""
    await _worker(host, port, head, 200, [], ok)
    lat: list[float] = []
    t0 = time.perf_counter()
    per = requests // concurrency
    await asyncio.gather(*(_worker(host, port, head, per, lat, ok) for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return {
        "rps": len(lat) / wall,
        "p50_ms": statistics.median(lat) * 1000,
        "p99_ms": pct(lat, 0.99) * 1000,
        "wall_s": wall,
        "requests": len(lat),
    }


#: A benchmark's load client: its command-line words after ``--client`` -> its figures.
Client = Callable[[list[str]], Awaitable[dict[str, float]]]


def run_client(script: str, *args: object) -> dict[str, float]:
    """``script --client ARGS...`` in a process of its own (the load apart from the server's); the figures it prints."""
    argv = [sys.executable, script, "--client", *(str(a) for a in args)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout))


def main(doc: str, bench: Callable[[int], Awaitable[None]], client: Client) -> None:
    """A proxy benchmark's command line: ``--client ARGS...`` runs ``client`` and prints its figures (JSON), else
    ``[--requests N]`` runs ``bench(N)``."""
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        print(json.dumps(asyncio.run(client(sys.argv[2:]))))
        return
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    asyncio.run(bench(parser.parse_args().requests))
