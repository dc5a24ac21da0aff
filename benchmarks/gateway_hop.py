#!/usr/bin/env python3
"""A request through a gateway beside the in-server proxy alone: same service, same machine.

Starts a corral server in this process (SQLite, the local backend; the job sandbox when run as root), applies a
one-replica service whose app is a tiny asyncio HTTP/1.1 server answering ``ok``, and a gateway of this server
(its row, with its secret) whose process, the real zipapp, runs on this machine's loopback: plain HTTP on a free
port, configured and given the service (``auth: true``) through its management API, as the server's gateways
worker does over SSH. A load client in a second process then sends GET requests over keep-alive connections,
with a member's token: through ``/proxy/services/main/bench/`` (the in-server proxy alone), then to the gateway
with the service's host name (gateway -> the server's proxy -> the replica). Prints requests per second and
p50/p99 latency at concurrency 1 and 16, and the load average. Figures, not assertions.

On a real gateway host the gateway reaches the server through the reverse forward of the server's SSH
connection, a hop this measurement leaves out; TLS is left out too (``benchmarks/gateway_throughput.py``
measures the gateway process alone, TLS included).

    python benchmarks/gateway_hop.py [--requests 3000]
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.in_process import InProcess, in_process_server
from benchlib.ok_service import load, main, run_client, start_ok_service
from benchlib.servers import free_port

SECRET = "gateway-hop-benchmark-secret"
MGMT_TOKEN = "gatewayhopmanagementtoken"
HOST = "bench.gw.bench"


# ---- the load client (a second process) ---------------------------------------------------------
async def _client(args: list[str]) -> dict[str, float]:
    port, host, path, token, n, conc = args[:6]
    head = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\nUser-Agent: bench\r\n\r\n".encode()
    return await load(int(port), head, int(n), int(conc))


# ---- the server and the gateway (this process and its child) ----------------------------------------
async def _service(srv: InProcess) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=srv.url, headers={"Authorization": f"Bearer {srv.token}"}, timeout=30) as c:
        await start_ok_service(c)


async def _gateway(srv: InProcess, work: Path) -> tuple[subprocess.Popen[bytes], int]:
    """The gateway's row (its secret) and its process on loopback, configured with the service."""
    from corral.backends.gateway_api import GatewayApi, GatewayUnreachable
    from corral.domain.gateway_ops import registration_body
    from corral.domain.gateways import GatewayService
    from corral.gateway.zipapp import build_zipapp
    from corral.store import accounts
    from corral.store import gateways as gateway_store

    ctx = srv.prepared.ctx
    async with ctx.db.write() as conn:
        project = await accounts.get_project(conn, "main")
        assert project is not None
        conf = {"type": "gateway", "name": "hop", "backend": "remote", "region": "bench", "domain": "gw.bench"}
        digest = hashlib.sha256(SECRET.encode()).hexdigest()
        await gateway_store.create(conn, project.id, "hop", conf, digest, "unused", time.time(), None)
    zipapp = build_zipapp(work / "corral-gateway.pyz")
    (work / "token").write_text(MGMT_TOKEN)
    mgmt, http = free_port(), free_port()
    argv = [
        sys.executable, "-I", str(zipapp), "serve", "--state-dir", str(work / "state"),
        "--management", f"127.0.0.1:{mgmt}", "--token-file", str(work / "token"),
        "--http", f"127.0.0.1:{http}", "--https", "off",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(work / "gateway.log", "wb"))  # noqa: SIM115
    api = GatewayApi(f"http://127.0.0.1:{mgmt}", MGMT_TOKEN)
    try:
        for _ in range(100):
            try:
                await api.health()
                break
            except GatewayUnreachable:
                await asyncio.sleep(0.1)
        await api.configure(srv.url, SECRET)
        svc = GatewayService(
            project_name="main", run_name="bench", run_id="", host=HOST, https=False, auth=True,
            rate_limits=(), model=None, upstream_path="/proxy/services/main/bench/",
        )  # fmt: skip
        await api.register("main", "bench", registration_body(svc))
    finally:
        await api.aclose()
    return proc, http


async def bench(requests: int) -> None:
    async with in_process_server("corral-gateway-hop-", local_cpus=4, local_memory_mib=8192) as srv:
        await _service(srv)
        with tempfile.TemporaryDirectory(prefix="corral-gateway-hop-") as tmp:
            proc, http = await _gateway(srv, Path(tmp))
            try:
                server_port = int(srv.url.rsplit(":", 1)[1])
                paths = {
                    "in-server proxy": (server_port, f"127.0.0.1:{server_port}", "/proxy/services/main/bench/"),
                    "gateway + proxy": (http, HOST, "/"),
                }
                results: dict[tuple[str, int], dict[str, float]] = {}
                for name, (port, host, path) in paths.items():
                    for conc in (1, 16):
                        results[(name, conc)] = await asyncio.to_thread(
                            run_client, __file__, port, host, path, srv.token, requests, conc
                        )
            finally:
                proc.terminate()
                proc.wait(10)
    load = os.getloadavg()
    print(f"gateway hop ({requests} GETs per figure, keep-alive, a member's token, sandbox={srv.settings.sandbox})")
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} CPUs")
    print(f"{'path':<18}{'conc':>5}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}")
    for (name, conc), res in results.items():
        print(f"{name:<18}{conc:>5}{res['rps']:>10.0f}{res['p50_ms']:>10.3f}{res['p99_ms']:>10.3f}")
    for conc in (1, 16):
        p, g = results[("in-server proxy", conc)], results[("gateway + proxy", conc)]
        print(f"added by the gateway at concurrency {conc}: p50 {g['p50_ms'] - p['p50_ms']:.3f} ms, "
              f"p99 {g['p99_ms'] - p['p99_ms']:.3f} ms")  # fmt: skip


if __name__ == "__main__":
    main(__doc__ or "", bench, _client)
