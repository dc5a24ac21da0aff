"""A cloud fleet on EC2 (moto), end to end: config.yml's ``type: aws`` block with its credentials checked
and sealed, priced offers, instances launched with corral's tags and client tokens and reached over SSH
(fake hosts at their private IPs, the UserData run in them), the seed's scenario counted in EC2 itself,
adoption after a crash, and termination confirmed by DescribeInstances."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from moto_harness import REGION, VPC_NAME, Hypervisor, MotoEC2

from fakehosts import FakeHosts
from server_harness import RunningServer, finished_run, make_settings, running_server, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="module")

CONFIG = f"""
projects:
  - name: main
    backends:
      - type: aws
        creds: {{type: access_key, access_key: AKIATESTKEY, secret_key: test-secret-value}}
        regions: [{REGION}]
        vpc_name: {VPC_NAME}
        public_ips: false
        tags: {{team: ml}}
"""
FLEET = {"type": "fleet", "name": "awsfl", "nodes": "0..3", "backends": ["aws"], "resources": {"cpu": "2.."}}


@pytest.fixture(scope="module")
def hypervisor(moto: MotoEC2, cloud_hosts: FakeHosts) -> Iterator[Hypervisor]:
    moto.make_vpc(cloud_hosts.subnet)
    hv = Hypervisor(moto, cloud_hosts).start()
    try:
        yield hv
    finally:
        hv.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory, hypervisor: Hypervisor) -> AsyncIterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("awsserver")
    settings = make_settings(tmp, provisioning_timeout=60.0, safety_net_interval=2.0)
    settings.server_dir.mkdir(parents=True)
    (settings.server_dir / "config.yml").write_text(CONFIG)
    async with running_server(settings) as s:
        async with s.client() as c:
            r = await c.post(
                "/api/project/main/fleets/apply",
                json={"plan": {"spec": {"configuration": FLEET, "profile": {}}}, "force": True},
            )
            assert r.status_code == 200, r.text
        yield s
        async with s.client() as c:
            await c.post("/api/project/main/fleets/delete", json={"names": ["awsfl"]})

            async def gone() -> bool:
                return not hypervisor.moto.instances(instance_state_name=["pending", "running", "shutting-down"])

            await wait_for(gone, timeout=60)


def _task(i: int) -> dict[str, Any]:
    conf = {"type": "task", "name": f"seed-{i}", "commands": [f"echo out-{i}"], "fleets": ["awsfl"],
            "creation_policy": "reuse-or-create", "resources": {"cpu": "2.."}}  # fmt: skip
    return {"force": True, "plan": {"run_spec": {"configuration": conf}}}


async def test_credentials_sealed_at_rest_and_never_returned(server: RunningServer) -> None:
    async with server.ctx.db.read() as conn:
        raw = (await conn.exec_driver_sql("SELECT backends FROM projects WHERE name = 'main'")).scalar_one()
    assert "test-secret-value" not in raw and "AKIATESTKEY" not in raw
    assert json.loads(raw)[0]["creds"]["secret_key"].startswith("enc:v1:")
    async with server.client() as c:
        got = (await c.post("/api/projects/main/get")).text
    assert "test-secret-value" not in got and "enc:v1:" not in got


async def test_offers_are_priced_cheapest_first_in_the_backend_regions(server: RunningServer) -> None:
    async with server.client() as c:
        r = await c.post("/api/project/main/runs/get_plan", json=_task(0)["plan"])
        assert r.status_code == 200, r.text
        offers = r.json()["job_plans"][0]["offers"]
        assert offers and {o["backend"] for o in offers} == {"aws"} and {o["region"] for o in offers} == {REGION}
        prices = [o["price"] for o in offers]
        assert prices == sorted(prices) and prices[0] > 0
        capped = _task(0)["plan"]
        capped["run_spec"]["configuration"]["max_price"] = 0.1
        r = await c.post("/api/project/main/runs/get_plan", json=capped)
        assert all(o["price"] <= 0.1 for o in r.json()["job_plans"][0]["offers"])


async def test_seed_scenario_holds_nodes_max_in_ec2(server: RunningServer, hypervisor: Hypervisor) -> None:
    hypervisor.reset_peak()
    async with server.client() as c:
        for i in range(10):
            r = await c.post("/api/project/main/runs/apply", json=_task(i))
            assert r.status_code == 200, r.text
        rs = await asyncio.gather(*(c.post("/api/project/main/runs/apply", json=_task(i)) for i in range(10, 30)))
        assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200]
        for i in range(30):
            run = await finished_run(c, f"seed-{i}", timeout=180)
            sub = run["jobs"][0]["job_submissions"][-1]
            assert run["status"] == "done", (
                i,
                sub.get("termination_reason_message"),
                sub.get("status_message"),
                sub.get("exit_status"),
            )
            logs = await c.post(
                "/api/project/main/logs/poll",
                json={"run_name": f"seed-{i}", "job_submission_id": run["jobs"][0]["job_submissions"][-1]["id"]},
            )
            text = "".join(__import__("base64").b64decode(e["message"]).decode() for e in logs.json()["logs"])
            assert f"out-{i}" in text
    assert not hypervisor.errors, hypervisor.errors
    assert 1 <= hypervisor.peak <= 3
    tagged = [i for i in hypervisor.moto.instances() if {"Key": "owner", "Value": "corral"} in (i.get("Tags") or [])]
    assert 1 <= len(tagged) <= 3
    for inst in tagged:
        tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
        assert tags["corral_project"] == "main" and tags["corral_fleet"] == "awsfl" and tags["team"] == "ml"
        assert tags["corral_server"] and tags["corral_instance"]
        assert inst["ClientToken"] == f"corral-{tags['corral_instance']}-1"
        assert inst["InstanceType"] == "m7i.large"  # the cheapest type with 2 CPUs and 8 GB in the catalogue
