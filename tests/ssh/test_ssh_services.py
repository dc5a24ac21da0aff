"""A service on an SSH fleet: two replicas on two fake hosts, reached by the proxy through each host's SSH
connection (the replicas' ports are on the hosts' loopback, never exposed), traffic to both, and one
replica killed with SIGKILL replaced while the other serves."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx
from ssh_harness import apply_fleet, fleet_settled, host_run, ssh_fleet

from fakehosts import FakeHosts
from server_harness import RunningServer, get_run, wait_for

APP = base64.b64encode((Path(__file__).parents[1] / "proxy" / "replica_app.py").read_bytes()).decode()
BASE = "/proxy/services/main/ssh-svc/"


async def _ready(c: httpx.AsyncClient) -> dict[int, dict[str, Any]] | None:
    run = await get_run(c, "ssh-svc")
    subs = {j["job_spec"]["replica_num"]: j["job_submissions"][-1] for j in run["jobs"]}
    ok = {n: s for n, s in subs.items() if s["status"] == "running" and s.get("corral_ready")}
    return ok if len(ok) == 2 else None


async def test_a_service_on_ssh_hosts_is_proxied_and_a_killed_replica_replaced(
    server: RunningServer, hosts: FakeHosts
) -> None:
    async with server.client() as c:
        await apply_fleet(c, ssh_fleet(hosts, "two", [hosts.ip("cpu1"), hosts.ip("gpu")]))
        await wait_for(lambda: fleet_settled(c, "two", 2), timeout=40)
        configuration = {
            "type": "service",
            "name": "ssh-svc",
            "port": 8000,
            "replicas": 2,
            "commands": [f"echo {APP} | base64 -d > app.py", "exec python3 app.py 8000"],
            "probes": [{"type": "http", "url": "/health", "interval": "1s"}],
            "resources": {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."},
        }
        r = await c.post(
            "/api/project/main/runs/apply",
            json={"force": False, "plan": {"run_spec": {"configuration": configuration}}},
        )
        assert r.status_code == 200, r.text
        subs = await wait_for(lambda: _ready(c), timeout=60, interval=0.3)
        seen = {(await c.get(BASE + "whoami")).text for _ in range(6)}
        assert seen == {s["id"] for s in subs.values()}, seen
        victim = subs[0]["id"]
        host = "cpu1" if subs[0]["job_provisioning_data"]["internal_ip"] == hosts.ip("cpu1") else "gpu"
        await host_run(hosts, host, "pkill -9 -f 'python3 app.py 8000'")

        async def replaced() -> dict[int, dict[str, Any]] | None:
            got = await _ready(c)
            return got if got and victim not in {s["id"] for s in got.values()} else None

        await wait_for(replaced, timeout=60, interval=0.3)
        assert (await get_run(c, "ssh-svc"))["status"] == "running"
        assert (await c.get(BASE + "whoami")).status_code == 200
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["ssh-svc"], "abort": True})
