"""Spot on EC2 (moto), end to end: ``spot_policy`` in plans and ``gpus/list`` (dstack's default on-demand,
``auto`` either, cheapest first), a spot-only run launched with ``InstanceMarketOptions`` and never put on an
on-demand instance, and an interruption -- the test terminates the instance through moto, as EC2 reclaims a
spot instance -- found through DescribeInstances within one host check: the job ends
``interrupted_by_no_capacity`` (``interrupted``, as dstack reports it) and ``retry: {on_events:
[interruption]}`` submits it again, on a new spot instance."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import pytest
import pytest_asyncio
from aws_server import fleet_server
from moto_harness import REGION, VPC_NAME, FaultProxy, Hypervisor

from server_harness import RunningServer, finished_run, get_run, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="module")

CONFIG = f"""
projects:
  - name: main
    backends:
      - type: aws
        creds: {{type: access_key, access_key: AKIASPOT, secret_key: spot-secret-value}}
        regions: [{REGION}]
        vpc_name: {VPC_NAME}
        public_ips: false
"""
FLEET = {"type": "fleet", "name": "spotfl", "nodes": "0..2", "backends": ["aws"], "spot_policy": "auto",
         "resources": {"cpu": "2.."}}  # fmt: skip


def _task(name: str, commands: list[str], **conf: Any) -> dict[str, Any]:
    configuration = {"type": "task", "name": name, "commands": commands, "fleets": ["spotfl"],
                     "resources": {"cpu": "2.."}, **conf}  # fmt: skip
    return {"force": True, "plan": {"run_spec": {"configuration": configuration}}}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(
    tmp_path_factory: pytest.TempPathFactory, hypervisor: Hypervisor, proxy: FaultProxy
) -> AsyncIterator[RunningServer]:
    # the agent's unreachable timeout is far away: an interruption is found through EC2's API, not by it
    async with fleet_server(
        tmp_path_factory.mktemp("spotserver"), CONFIG, FLEET, hypervisor, cleanup="fleet",
        safety_net_interval=2.0, instance_check_interval=1.0, agent_unreachable_timeout=600.0,
    ) as s:  # fmt: skip
        yield s


async def test_plans_and_gpus_list_follow_the_spot_policy(server: RunningServer) -> None:
    async def offers(**options: Any) -> list[dict[str, Any]]:
        conf = {"type": "task", "commands": ["true"], "resources": {"cpu": "2.."}, **options}
        async with server.client() as c:
            r = await c.post("/api/project/main/runs/get_plan", json={"run_spec": {"configuration": conf}})
        assert r.status_code == 200, r.text
        return list(r.json()["job_plans"][0]["offers"])

    default, spot, auto = await offers(), await offers(spot_policy="spot"), await offers(spot_policy="auto")
    assert default and not any(o["instance"]["resources"]["spot"] for o in default)  # dstack: on-demand
    assert spot and all(o["instance"]["resources"]["spot"] for o in spot)
    assert {o["instance"]["resources"]["spot"] for o in auto} == {True, False}
    assert auto[0]["instance"]["resources"]["spot"]  # cheapest first: spot comes first
    async with server.client() as c:

        async def gpus(**options: Any) -> list[dict[str, Any]]:
            conf = {"type": "task", "commands": ["true"], "resources": {"gpu": "A10G"}, **options}
            r = await c.post("/api/project/main/gpus/list", json={"run_spec": {"configuration": conf}})
            assert r.status_code == 200, r.text
            return list(r.json()["gpus"])

        assert {tuple(g["spot"]) for g in await gpus()} == {("on-demand",)}
        assert {tuple(g["spot"]) for g in await gpus(spot_policy="spot")} == {("spot",)}
        assert {tuple(g["spot"]) for g in await gpus(spot_policy="auto")} == {("on-demand", "spot")}


async def test_a_spot_interruption_is_found_through_ec2_and_resubmitted(
    server: RunningServer, hypervisor: Hypervisor
) -> None:
    moto = hypervisor.moto
    retry = {"on_events": ["interruption"], "duration": "1h"}
    async with server.client() as c:
        # an on-demand run first: its instance is on-demand, and the spot run below must not land on it
        r = await c.post("/api/project/main/runs/apply", json=_task("od", ["sleep 300"]))
        assert r.status_code == 200, r.text
        r = await c.post(
            "/api/project/main/runs/apply", json=_task("sp", ["sleep 300"], spot_policy="spot", retry=retry)
        )
        assert r.status_code == 200, r.text

        seen: dict[str, Any] = {}  # what the submissions said last (a failure shows it)

        async def running(name: str, submissions: int = 1) -> dict[str, Any] | None:
            subs = (await get_run(c, name))["jobs"][0]["job_submissions"]
            seen[name] = [(x["status"], x.get("status_message"), x.get("termination_reason_message")) for x in subs]
            return subs[-1] if len(subs) == submissions and subs[-1]["status"] == "running" else None

        od = await wait_for(lambda: running("od"), timeout=120)
        first = await wait_for(lambda: running("sp"), timeout=120)
        assert seen["od"] and seen["sp"]
        assert od["job_provisioning_data"]["instance_type"]["resources"]["spot"] is False
        assert first["job_provisioning_data"]["instance_type"]["resources"]["spot"] is True
        ec2_id = _ec2(moto, first)
        assert _ec2(moto, first, "InstanceLifecycle") == "spot"  # RunInstances had InstanceMarketOptions
        assert _ec2(moto, od, "InstanceLifecycle") != "spot"
        listed = {i["id"]: i for i in (await c.post("/api/instances/list", json={})).json()}
        assert (
            listed[first["job_provisioning_data"]["corral_instance_id"]]["instance_type"]["resources"]["spot"] is True
        )
        assert listed[od["job_provisioning_data"]["corral_instance_id"]]["instance_type"]["resources"]["spot"] is False

        moto.client().terminate_instances(InstanceIds=[ec2_id])  # EC2 reclaims it

        async def interrupted() -> dict[str, Any] | None:
            subs = (await get_run(c, "sp"))["jobs"][0]["job_submissions"]
            return subs[0] if subs[0]["status"] == "failed" else None

        gone = await wait_for(interrupted, timeout=20)
        assert gone["termination_reason"] == "interrupted_by_no_capacity", gone
        assert gone["status_message"] == "interrupted"
        assert (
            ec2_id in gone["termination_reason_message"]
            and "not terminated by corral" in gone["termination_reason_message"]
        )
        # the run is submitted again, and runs on a new spot instance
        second = await wait_for(lambda: running("sp", submissions=2), timeout=120)
        assert second["job_provisioning_data"]["instance_type"]["resources"]["spot"] is True
        assert _ec2(moto, second) not in (ec2_id, _ec2(moto, od))
        assert _ec2(moto, second, "InstanceLifecycle") == "spot"
        # the on-demand run was not touched
        assert (await get_run(c, "od"))["jobs"][0]["job_submissions"][-1]["status"] == "running"
        r = await c.post("/api/project/main/runs/stop", json={"runs_names": ["od", "sp"], "abort": True})
        assert r.status_code == 200, r.text
        for name in ("od", "sp"):
            ended = await finished_run(c, name, timeout=60)
            # each submission on an instance is charged its price for its time there, never for a wait (the
            # seconds here at the catalogue's cents an hour round to $0 or $0.0001, as dstack rounds)
            assert 0 <= ended["cost"] <= _most(ended), ended["cost"]


def _most(run: dict[str, Any]) -> float:
    """The most a run can cost: each submission's price for its whole life, submitted to finished."""

    def at(ts: str) -> float:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()

    subs = [s for j in run["jobs"] for s in j["job_submissions"] if s["job_provisioning_data"]]
    most = sum(
        float(s["job_provisioning_data"]["price"]) * (at(s["finished_at"]) - at(s["submitted_at"])) for s in subs
    )
    return round(most / 3600, 4) + 0.0001


def _ec2(moto: Any, sub: dict[str, Any], key: str = "InstanceId") -> Any:
    """``key`` of the EC2 instance of a job submission (found by corral's tag naming the instance row), which
    the submission names as dstack does: backend ``aws``, EC2's instance id, its region."""
    jpd = sub["job_provisioning_data"]
    tag = {"Name": "tag:corral_instance", "Values": [jpd["corral_instance_id"]]}
    (inst,) = [i for r in moto.client().describe_instances(Filters=[tag])["Reservations"] for i in r["Instances"]]
    assert (jpd["backend"], jpd["instance_id"], jpd["region"]) == ("aws", inst["InstanceId"], REGION)
    return inst.get(key)
