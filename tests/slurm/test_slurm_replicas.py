"""Two ``corral server`` replicas on one Postgres and the real test cluster: an allocation that pends in Slurm far
longer than the provisioning lease stays the one replica's that submitted it (its lease is renewed while it
waits), is never adopted by the other replica nor cancelled by either, and runs its job once the nodes free up."""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml
from dstack_client_env import CorralServer, corral_server
from test_slurm_runs import corral_jobs, slurm_config

from pg_harness import new_database_url
from skip_policy import needs_root
from slurm_harness import CPU_NODES, SlurmTestCluster

pytestmark = needs_root("the Slurm cluster runs in network namespaces")

TOKEN = "slurm-replicas-admin-token-0123456789"
#: A lease of 10 s (the provisioning timeout and 5 s), passes every second: the allocation pends 3 leases long.
ENV = {
    "CORRAL_INSTANCE_CHECK_INTERVAL": "1",
    "CORRAL_SAFETY_NET_INTERVAL": "1",
    "CORRAL_PROVISIONING_TIMEOUT": "5",
}
PENDING_FOR = 30.0


def _replica_dir(slurm: SlurmTestCluster, tmp: Path) -> Path:
    key = tmp / "cluster_key"
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_text(slurm.key_pem())
    key.chmod(0o600)
    (tmp / "server").mkdir(parents=True, exist_ok=True)
    (tmp / "server" / "config.yml").write_text(yaml.safe_dump(slurm_config(slurm, key)))
    return tmp


def _wait(condition: Callable[[], Any], servers: list[CorralServer], timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, "\n\n".join(s.log_tail(60) for s in servers)
        time.sleep(0.25)
    return value


def test_a_long_pending_allocation_stays_with_the_replica_that_submitted_it(
    slurm: SlurmTestCluster, tmp_path: Path
) -> None:
    blockers = [
        slurm.as_user("sbatch --parsable -p cpu -N1 --exclusive -o /dev/null --wrap 'sleep 300'").strip()
        for _ in CPU_NODES
    ]
    env = {
        **ENV,
        "CORRAL_DATABASE_URL": new_database_url(),
        "CORRAL_SERVER_ENCRYPTION_KEY": base64.b64encode(os.urandom(32)).decode(),
    }
    with ExitStack() as stack:
        servers = [
            stack.enter_context(corral_server(_replica_dir(slurm, tmp_path / f"replica{i}"), TOKEN, **env))
            for i in range(2)
        ]
        fleet = {"type": "fleet", "name": "hpc", "nodes": "0..3", "backends": ["slurm"]}
        r = servers[0].api(
            "/api/project/main/fleets/apply",
            {"force": False, "plan": {"spec": {"configuration": fleet, "profile": {}}}},
        )
        assert r.status_code == 200, r.text
        task: dict[str, Any] = {"type": "task", "name": "patient", "commands": ["echo ran"], "fleets": ["hpc"]}
        task["resources"] = {"cpu": "1..", "memory": "0.1GB.."}
        r = servers[1].api(
            "/api/project/main/runs/apply", {"force": True, "plan": {"run_spec": {"configuration": task}}}
        )
        assert r.status_code == 200, r.text
        seen: set[str] = set()

        def pending() -> bool:
            jobs = corral_jobs(slurm, ("PENDING",))
            seen.update(j["id"] for j in jobs)
            return bool(jobs)

        _wait(pending, servers)
        until = time.monotonic() + PENDING_FOR
        while time.monotonic() < until:  # three leases long, both replicas' passes running every second
            seen.update(j["id"] for j in corral_jobs(slurm, ("PENDING", "RUNNING")))
            time.sleep(0.5)
        message = servers[0].api("/api/project/main/runs/get", {"run_name": "patient"}).json()
        assert "pending: Resources" in message["latest_job_submission"]["status_message"], message
        instances = servers[1].api("/api/instances/list", {}).json()
        assert [i["status_message"] for i in instances if i["status"] == "pending"] == [
            f"Slurm job {next(iter(seen))} pending: Resources"
        ], instances
        slurm.as_user("scancel " + " ".join(blockers))

        def finished() -> dict[str, Any] | None:
            run = dict(servers[0].api("/api/project/main/runs/get", {"run_name": "patient"}).json())
            seen.update(j["id"] for j in corral_jobs(slurm, ("PENDING", "RUNNING")))
            return run if run["status"] in ("done", "failed", "terminated") else None

        run = _wait(finished, servers)
        assert run["status"] == "done", run
        assert len(seen) == 1, seen  # one allocation, never cancelled and submitted again
        for server in servers:
            log = server.log_path.read_text(errors="replace")
            assert "adopting Slurm job" not in log, server.log_tail(80)
            assert "Traceback" not in log, server.log_tail(80)
        states = {j["id"]: j["state"] for j in slurm.squeue()}
        assert states[next(iter(seen))] in ("COMPLETED", "COMPLETING", "CANCELLED"), states
        servers[0].api("/api/project/main/fleets/delete", {"names": ["hpc"]})
        _wait(lambda: not servers[0].api("/api/project/main/fleets/list", {}).json(), servers, timeout=60)
