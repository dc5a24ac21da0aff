"""The orphan reaper with its default settings, on EC2 (moto), through the server's own passes: an instance
tagged with this server's id and no row is terminated within two minutes of its launch; one launched just
now is left alone; one whose row lives (a run's instance) is never touched; another server's is not either."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aws_server import fleet_server
from moto_harness import AMIS, REGION, VPC_NAME, FaultProxy, Hypervisor, MotoEC2

from corral.services import cloud_backends
from corral.settings import Settings
from server_harness import RunningServer, finished_run, get_run, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="module")

CONFIG = f"""
projects:
  - name: main
    backends:
      - type: aws
        creds: {{type: access_key, access_key: AKIAORPHANS, secret_key: orphan-secret}}
        regions: [{REGION}]
        vpc_name: {VPC_NAME}
        public_ips: false
"""
FLEET = {"type": "fleet", "name": "orphfl", "nodes": "0..1", "backends": ["aws"], "resources": {"cpu": "2.."}}
#: What the task asks for: an orphan must be gone within two minutes of its launch.
BOUND = 120.0


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(
    tmp_path_factory: pytest.TempPathFactory, hypervisor: Hypervisor, proxy: FaultProxy
) -> AsyncIterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("orphans")
    async with fleet_server(tmp, CONFIG, FLEET, hypervisor, cleanup="fleet", safety_net_interval=2.0) as s:
        yield s


def _launch(moto: MotoEC2, tags: dict[str, str]) -> str:
    ec2 = moto.client()
    subnet = ec2.describe_subnets(Filters=[{"Name": "cidr-block", "Values": [moto.cidr]}])["Subnets"][0]["SubnetId"]
    reply = ec2.run_instances(
        ImageId=AMIS[0]["ami_id"], InstanceType="m7i.large", MinCount=1, MaxCount=1, SubnetId=subnet,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
    )  # fmt: skip
    return str(reply["Instances"][0]["InstanceId"])


def _states(moto: MotoEC2, ids: list[str]) -> dict[str, str]:
    found = moto.client().describe_instances(InstanceIds=ids)["Reservations"]
    return {i["InstanceId"]: i["State"]["Name"] for r in found for i in r["Instances"]}


async def test_an_orphan_is_reaped_within_two_minutes_and_nothing_else_is(
    server: RunningServer, hypervisor: Hypervisor
) -> None:
    moto = hypervisor.moto
    assert server.settings.orphan_grace == Settings.orphan_grace  # the defaults, as shipped
    assert server.settings.orphan_interval == Settings.orphan_interval
    async with server.client() as c:
        conf = {"type": "task", "name": "keeps", "commands": ["sleep 600"], "fleets": ["orphfl"],
                "resources": {"cpu": "2.."}}  # fmt: skip
        r = await c.post(
            "/api/project/main/runs/apply", json={"force": True, "plan": {"run_spec": {"configuration": conf}}}
        )
        assert r.status_code == 200, r.text

        async def running() -> dict[str, Any] | None:
            sub = (await get_run(c, "keeps"))["jobs"][0]["job_submissions"][-1]
            return sub if sub["status"] == "running" else None

        with_row = str((await wait_for(running, timeout=120))["job_provisioning_data"]["instance_id"])
        me = await cloud_backends.server_id(server.ctx.db)
        orphan = _launch(moto, {"owner": "corral", "corral_server": me, "corral_instance": "no-such-row"})
        launched = time.monotonic()
        other = _launch(moto, {"owner": "corral", "corral_server": "another-server", "corral_instance": "x"})
        young: str | None = None
        young_at = 0.0
        while time.monotonic() - launched < BOUND:
            states = _states(moto, [orphan, with_row, other] + ([young] if young else []))
            if states[orphan] in ("shutting-down", "terminated"):
                break
            if young is None and time.monotonic() - launched > 45:
                young = _launch(moto, {"owner": "corral", "corral_server": me, "corral_instance": "also-no-row"})
                young_at = time.monotonic()
            await asyncio.sleep(1.0)
        reaped_after = time.monotonic() - launched
        assert states[orphan] in ("shutting-down", "terminated"), f"not reaped within {BOUND:g}s"
        assert reaped_after > server.settings.orphan_grace - 5  # and not before its grace was up
        # a young one (launched well within the grace) is left alone meanwhile; the others never go
        states = _states(moto, [with_row, other] + ([young] if young else []))
        assert states[with_row] == states[other] == "running", states
        if young is not None:
            assert time.monotonic() - young_at < server.settings.orphan_grace
            assert states[young] == "running", states
        r = await c.post("/api/project/main/runs/stop", json={"runs_names": ["keeps"], "abort": True})
        assert r.status_code == 200, r.text
        await finished_run(c, "keeps", timeout=60)
    moto.client().terminate_instances(InstanceIds=[other] + ([young] if young else []))
