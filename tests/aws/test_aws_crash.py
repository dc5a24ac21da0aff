"""A ``corral server`` process SIGKILLed between RunInstances and the commit that records its instance,
then started again on the same state directory and the same EC2 (moto): the row's instance is found by its
``corral_instance`` tag and adopted -- exactly one instance in EC2, no second launch -- and the job runs.

The fault proxy in front of moto holds RunInstances' answer (moto has made the instance) until the test
has killed the server, so the server never hears of the instance it launched."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
from dstack_client_env import corral_server
from moto_harness import REGION, VPC_NAME, FaultProxy, Hypervisor, MotoEC2

TOKEN = "crash-test-token"
CONFIG = f"""
projects:
  - name: main
    backends:
      - type: aws
        creds: {{type: access_key, access_key: AKIACRASHTEST, secret_key: crash-secret}}
        regions: [{REGION}]
        vpc_name: {VPC_NAME}
        public_ips: false
"""
FLEET = {"type": "fleet", "name": "crashfl", "nodes": "0..1", "backends": ["aws"], "resources": {"cpu": "2.."}}
TASK = {"type": "task", "name": "after-crash", "commands": ["echo survived"], "fleets": ["crashfl"],
        "creation_policy": "reuse-or-create", "resources": {"cpu": "2.."}}  # fmt: skip


def _post(url: str, path: str, body: Any) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)


def _fleet_instances(moto: MotoEC2, *states: str) -> list[dict[str, Any]]:
    filters = [{"Name": "tag:corral_fleet", "Values": ["crashfl"]}]
    if states:
        filters.append({"Name": "instance-state-name", "Values": list(states)})
    pages = moto.client().describe_instances(Filters=filters)
    return [i for r in pages["Reservations"] for i in r["Instances"]]


def _until(fn: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.2)


async def test_a_server_killed_after_run_instances_adopts_its_instance_on_restart(
    tmp_path: Path, moto: MotoEC2, hypervisor: Hypervisor, vpc: tuple[str, str, str]
) -> None:
    proxy = FaultProxy(moto.url).start()
    proxy.blocked_subnets.add(vpc[1])  # zone a: no capacity (and no fake host would answer there)
    proxy.hold = True
    (tmp_path / "server").mkdir()
    (tmp_path / "server" / "config.yml").write_text(CONFIG)
    env = {"AWS_ENDPOINT_URL": proxy.url, "AWS_EC2_METADATA_DISABLED": "true", "CORRAL_PROVISIONING_TIMEOUT": "60"}
    try:
        with corral_server(tmp_path, TOKEN, **env) as first:
            r = _post(
                first.url,
                "/api/project/main/fleets/apply",
                {"plan": {"spec": {"configuration": FLEET, "profile": {}}}, "force": True},
            )
            assert r.status_code == 200, r.text
            r = _post(
                first.url,
                "/api/project/main/runs/apply",
                {"force": True, "plan": {"run_spec": {"configuration": TASK}}},
            )
            assert r.status_code == 200, r.text
            assert await asyncio.to_thread(proxy.launched.wait, 60), first.log_tail()
            os.killpg(first.proc.pid, signal.SIGKILL)  # moto made the instance; the server never heard of it
            first.proc.wait(10)
        proxy.hold = False
        proxy.release.set()
        launched = _fleet_instances(moto, "pending", "running")
        assert len(launched) == 1, launched
        ec2_id = launched[0]["InstanceId"]
        row_id = {t["Key"]: t["Value"] for t in launched[0]["Tags"]}["corral_instance"]
        db = sqlite3.connect(tmp_path / "server" / "data" / "corral.db")
        status, agent = db.execute("SELECT status, agent FROM instances WHERE id = ?", (row_id,)).fetchone()
        db.close()
        assert status == "pending" and not agent  # the commit never happened

        with corral_server(tmp_path, TOKEN, **env) as second:

            def finished() -> dict[str, Any] | None:
                run = _post(second.url, "/api/project/main/runs/get", {"run_name": "after-crash"}).json()
                return run if run["status"] in ("done", "failed", "terminated") else None

            run = await asyncio.to_thread(_until, finished, 120, "the run after the restart")
            sub = run["jobs"][0]["job_submissions"][-1]
            assert run["status"] == "done", (sub.get("termination_reason_message"), second.log_tail())
            live = _fleet_instances(moto, "pending", "running", "stopping", "stopped", "shutting-down")
            assert [i["InstanceId"] for i in live] == [ec2_id]  # exactly one instance in EC2: adopted
            assert [lt.token for lt in proxy.launches] == [f"corral-{row_id}-1", f"corral-{row_id}-2"]
            db = sqlite3.connect(tmp_path / "server" / "data" / "corral.db")
            (agent,) = db.execute("SELECT agent FROM instances WHERE id = ?", (row_id,)).fetchone()
            db.close()
            assert json.loads(agent)["connection"]["aws"]["instance_id"] == ec2_id
            r = _post(second.url, "/api/project/main/fleets/delete", {"names": ["crashfl"]})
            assert r.status_code == 200, r.text
            await asyncio.to_thread(
                _until, lambda: not _fleet_instances(moto, "pending", "running", "shutting-down"), 60, "termination"
            )
    finally:
        proxy.release.set()
        proxy.stop()
