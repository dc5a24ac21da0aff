"""Three `corral server` replicas on one Postgres: the hard limit holds across them, wake-ups cross
replicas, and a replica killed with SIGKILL mid-work loses nothing and duplicates nothing."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from pg_harness import new_database_url

TOKEN = "replica-token"
FLEET = {"type": "fleet", "name": "test-fleet", "nodes": "0..3", "resources": {"cpu": "1.."}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _body(commands: list[str]) -> dict[str, Any]:
    conf = {"type": "task", "creation_policy": "reuse-or-create", "commands": commands, "fleets": ["test-fleet"]}
    return {"force": True, "plan": {"run_spec": {"configuration": conf}}}


class Replicas:
    def __init__(self, tmp: Path, count: int) -> None:
        self.db = new_database_url()
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes] | None] = []
        self.urls: list[str] = []
        key = base64.b64encode(os.urandom(32)).decode()  # every replica of a database has the same key
        for i in range(count):
            port = _free_port()
            env = {
                **os.environ,
                "CORRAL_DATABASE_URL": self.db,
                "CORRAL_SERVER_DIR": str(tmp / f"replica{i}"),
                "CORRAL_CONFIG_DIR": str(tmp / f"cli{i}"),
                "CORRAL_LOCAL_INSTANCES_DIR": str(tmp / "instances"),
                "CORRAL_SERVER_ADMIN_TOKEN": TOKEN,
                "CORRAL_SERVER_ENCRYPTION_KEY": key,
                "CORRAL_SAFETY_NET_INTERVAL": "60",
                "CORRAL_LOCAL_MAX_INSTANCES": "8",
                "CORRAL_LOCAL_CPUS": "16",  # room for 8 local instances, whatever machine runs the test
                "CORRAL_LOCAL_MEMORY": "128GB",
                "CORRAL_JOB_LEASE_TTL": "5",
                "CORRAL_AGENT_POLL_WAIT": "1",
                "CORRAL_PROVISIONING_TIMEOUT": "10",
            }
            log = open(tmp / f"replica{i}.log", "wb")  # noqa: SIM115 - the child writes it
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "corral.cli.main", "server", "--port", str(port)],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            self.urls.append(f"http://127.0.0.1:{port}")

    def client(self, i: int) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.urls[i], headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)

    async def wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        for i, url in enumerate(self.urls):
            while True:
                try:
                    httpx.get(f"{url}/healthcheck", timeout=1)
                    break
                except httpx.HTTPError:
                    proc = self.procs[i]
                    assert proc is not None and proc.poll() is None, (self.tmp / f"replica{i}.log").read_text()
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.1)

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        assert proc is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        self.procs[i] = None

    def live(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p is not None]

    async def shutdown(self) -> None:
        live = self.live()
        if live:
            async with self.client(live[0]) as c:
                try:
                    await c.post("/api/project/main/fleets/delete", json={"names": ["test-fleet"]})
                    deadline = time.monotonic() + 30
                    while time.monotonic() < deadline:
                        insts = (await c.post("/api/instances/list", json={})).json()
                        if all(i["status"] == "terminated" for i in insts):
                            break
                        await asyncio.sleep(0.3)
                except httpx.HTTPError:
                    pass
        for p in self.procs:
            if p is not None:
                p.terminate()
        for p in self.procs:
            if p is not None:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
        # Whatever agents are left (e.g. started by the killed replica and never terminated) must go.
        for pid_file in (self.tmp / "instances").glob("*/agent.pid"):
            try:
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError, PermissionError):
                pass


class Sampler:
    """Counts non-terminated instances as each live replica reports them, every 50 ms."""

    def __init__(self, replicas: Replicas) -> None:
        self.replicas = replicas
        self.max_seen = 0
        self.ids: set[str] = set()
        self._stop = asyncio.Event()

    async def run(self) -> None:
        clients = [self.replicas.client(i) for i in range(len(self.replicas.urls))]
        try:
            while not self._stop.is_set():
                for i in self.replicas.live():
                    try:
                        insts = (await clients[i].post("/api/instances/list", json={})).json()
                    except httpx.HTTPError:
                        continue
                    self.max_seen = max(self.max_seen, sum(1 for x in insts if x["status"] != "terminated"))
                    self.ids.update(x["id"] for x in insts)
                await asyncio.sleep(0.05)
        finally:
            for c in clients:
                await c.aclose()

    def stop(self) -> None:
        self._stop.set()


async def _all_finished(replicas: Replicas, names: list[str], timeout: float) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    async with replicas.client(replicas.live()[0]) as c:
        while True:
            runs: list[dict[str, Any]] = []
            prev: dict[str, Any] = {}
            while True:
                page = (await c.post("/api/runs/list", json={"limit": 100, **prev})).json()
                if not page:
                    break
                runs += page
                prev = {"prev_submitted_at": page[-1]["submitted_at"], "prev_run_id": page[-1]["id"]}
            mine = {r["run_spec"]["run_name"]: r for r in runs if r["run_spec"]["run_name"] in names}
            if len(mine) == len(names) and all(r["status"] in ("done", "failed", "terminated") for r in mine.values()):
                return mine
            assert time.monotonic() < deadline, sorted({r["status"] for r in mine.values()})
            await asyncio.sleep(0.5)


@pytest.fixture
async def replicas(tmp_path: Path) -> Any:
    r = Replicas(tmp_path, 3)
    try:
        await r.wait_ready()
        yield r
    finally:
        await r.shutdown()


def _assert_all_done(finished: dict[str, Any]) -> None:
    bad = [
        (n, r["status"], r["latest_job_submission"]["termination_reason_message"])
        for n, r in finished.items()
        if r["status"] != "done"
    ]
    assert not bad, bad[:5]


async def test_seed_scenario_across_three_replicas(replicas: Replicas) -> None:
    async with replicas.client(0) as c:
        r = await c.post(
            "/api/project/main/fleets/apply",
            json={"force": False, "plan": {"spec": {"configuration": FLEET, "profile": {}}}},
        )
        assert r.status_code == 200, r.text
    sampler = Sampler(replicas)
    sampling = asyncio.create_task(sampler.run())
    clients = [replicas.client(i) for i in range(3)]
    try:
        replies = await asyncio.gather(
            *(
                clients[k % 3].post("/api/project/main/runs/apply", json=_body(["date", "sleep 1", "date"]))
                for k in range(50)
            )
        )
    finally:
        for c in clients:
            await c.aclose()
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies if r.status_code != 200][:3]
    names = [r.json()["run_spec"]["run_name"] for r in replies]
    assert len(set(names)) == 50  # generated names never collide across replicas
    finished = await _all_finished(replicas, names, timeout=240)
    sampler.stop()
    await sampling
    _assert_all_done(finished)
    assert sampler.max_seen <= 3
    assert len(sampler.ids) <= 3
    # Logs are served by every replica, whichever collected them.
    run = finished[names[0]]
    for i in range(3):
        async with replicas.client(i) as c:
            logs = (
                await c.post(
                    "/api/project/main/logs/poll",
                    json={"run_name": names[0], "job_submission_id": run["latest_job_submission"]["id"]},
                )
            ).json()["logs"]
            assert len(logs) == 2


async def test_sigkill_one_replica_mid_work(replicas: Replicas) -> None:
    async with replicas.client(0) as c:
        r = await c.post(
            "/api/project/main/fleets/apply",
            json={"force": False, "plan": {"spec": {"configuration": FLEET, "profile": {}}}},
        )
        assert r.status_code == 200
    sampler = Sampler(replicas)
    sampling = asyncio.create_task(sampler.run())
    names: list[str] = []
    async with replicas.client(1) as c1, replicas.client(2) as c2:
        first = await asyncio.gather(
            *(
                (c1 if k % 2 else c2).post(
                    "/api/project/main/runs/apply", json=_body(["echo start", "sleep 2", "echo end"])
                )
                for k in range(12)
            )
        )
        names += [r.json()["run_spec"]["run_name"] for r in first]
        await asyncio.sleep(1.5)  # jobs are being placed, instances reserved and provisioned
        replicas.kill(1)
        second = await asyncio.gather(
            *(
                c2.post("/api/project/main/runs/apply", json=_body(["echo start", "sleep 1", "echo end"]))
                for _ in range(6)
            )
        )
        names += [r.json()["run_spec"]["run_name"] for r in second]
    finished = await _all_finished(replicas, names, timeout=240)
    sampler.stop()
    await sampling
    _assert_all_done(finished)
    assert sampler.max_seen <= 3
    async with replicas.client(0) as c:
        insts = (await c.post("/api/instances/list", json={})).json()
        live = [i for i in insts if i["status"] != "terminated"]
        assert len(live) <= 3
        assert len({i["instance_num"] for i in live}) == len(live)  # no instance duplicated
        # Every line of every run was stored exactly once, though a replica died while following.
        for name in names:
            sub = finished[name]["latest_job_submission"]
            logs = (
                await c.post("/api/project/main/logs/poll", json={"run_name": name, "job_submission_id": sub["id"]})
            ).json()["logs"]
            assert len(logs) == 2, (name, logs)
