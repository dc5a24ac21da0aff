"""The load generator: N POST requests from C concurrent asyncio workers over one httpx client (one
keep-alive connection per worker), recording every request's latency. Bodies are encoded before the
clock starts and responses are read but not parsed, so the client spends little CPU per request; its
own CPU time is reported so a reader can check it was not the bottleneck.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

API_HEADERS = {"X-API-VERSION": "0.22.5", "Content-Type": "application/json"}


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1)."""
    s = sorted(values)
    if not s:
        return float("nan")
    return s[min(len(s), max(1, math.ceil(q * len(s)))) - 1]


@dataclass
class LoadResult:
    requests: int
    wall_s: float
    latencies_s: list[float]
    errors: int
    first_error: str | None
    client_cpu_s: float
    response_bytes: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def rps(self) -> float:
        return self.requests / self.wall_s if self.wall_s else float("nan")

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies_s) * 1000

    @property
    def p99_ms(self) -> float:
        return pct(self.latencies_s, 0.99) * 1000

    @property
    def client_cpu_share(self) -> float:
        """Client CPU seconds per wall second (1.0 = one core busy)."""
        return self.client_cpu_s / self.wall_s if self.wall_s else float("nan")


async def _run(url: str, token: str, path: str, bodies: list[bytes], concurrency: int, timeout: float) -> LoadResult:
    latencies: list[float] = []
    errors = 0
    first_error: str | None = None
    nbytes = 0
    queue = iter(bodies)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {**API_HEADERS, "Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout, limits=limits) as client:

        async def worker() -> None:
            nonlocal errors, first_error, nbytes
            for body in queue:
                t0 = time.perf_counter()
                try:
                    r = await client.post(path, content=body)
                    status, text = r.status_code, r.content
                except httpx.HTTPError as e:
                    status, text = 0, repr(e).encode()
                latencies.append(time.perf_counter() - t0)
                nbytes += len(text)
                if status != 200:
                    errors += 1
                    if first_error is None:
                        first_error = f"{status}: {text[:300].decode(errors='replace')}"

        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return LoadResult(len(bodies), wall, latencies, errors, first_error, cpu, nbytes)


def run_load(
    url: str,
    token: str,
    path: str,
    make_body: Callable[[int], Any],
    n: int,
    concurrency: int = 8,
    timeout: float = 300.0,
) -> LoadResult:
    bodies = [json.dumps(make_body(i)).encode() for i in range(n)]
    return asyncio.run(_run(url, token, path, bodies, concurrency, timeout))


class Api:
    """A small synchronous client for set-up calls (not measured)."""

    def __init__(self, url: str, token: str) -> None:
        headers = {**API_HEADERS, "Authorization": f"Bearer {token}"}
        self.client = httpx.Client(base_url=url, headers=headers, timeout=300)

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def post(self, path: str, body: Any = None) -> Any:
        r = self.client.post(path, json=body)
        if r.status_code != 200:
            raise RuntimeError(f"POST {path} -> {r.status_code}: {r.text[:500]}")
        return r.json()
