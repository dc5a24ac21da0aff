"""The over-provisioning seed on an EC2 that looks like AWS: the body of dstack's bug report (a fleet with
``nodes: 0..3``, ten ``runs/apply`` in a loop, then twenty at once) against moto seeded with the real images
(``facts.py``), through the fault proxy (zone a has no capacity), with the server's own reaper running.

Throughout, a sampler counts the fleet's instances in EC2 and in corral: neither ever exceeds ``nodes.max``.
Every run ends ``done`` on a fake host booted at its instance's private IP (its output names that IP); each
instance carries corral's tags and a ``ClientToken`` derived from its row's id; each job says ``backend: aws``
and its EC2 instance id, as dstack's ``ps`` then shows it; each run's cost is its price for its time there;
and an instance tagged with this server's id that has no row is reaped within two minutes of its launch."""

from __future__ import annotations

import asyncio
import base64
import re
import subprocess
import threading
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import pytest
import pytest_asyncio
from aws_server import fleet_server
from dstack_client_env import cli_env, client_venv, short_home
from facts import UBUNTU_2204_NAME
from moto_harness import AMIS, REGION, VPC_NAME, FaultProxy, Hypervisor, MotoEC2

from corral.services import cloud_backends
from server_harness import RunningServer, finished_run

pytestmark = pytest.mark.asyncio(loop_scope="module")

CONFIG = f"""
projects:
  - name: main
    backends:
      - type: aws
        creds: {{type: access_key, access_key: AKIASEEDTEST, secret_key: seed-secret-value}}
        regions: [{REGION}]
        vpc_name: {VPC_NAME}
        public_ips: false
"""
NODES_MAX = 3
FLEET = {
    "type": "fleet",
    "name": "seedfl",
    "nodes": f"0..{NODES_MAX}",
    "backends": ["aws"],
    "resources": {"cpu": "2.."},
}
#: The test's own price list (gpuhunt's CSV columns): one type at a price of this test's (not AWS's), $3.60 an
#: hour -- a tenth of a cent a second, so that a run of a second costs more than dstack's rounding ($0.0001).
PRICE = 3.6
CATALOG = (
    "instance_name,location,price,cpu,memory,gpu_count,gpu_name,gpu_memory,spot,disk_size,gpu_vendor,flags,"
    f'cpu_arch,provider_data\nm7i.large,{REGION},{PRICE},2,8,0,,,False,,,,x86,"{{""source"":""test""}}"\n'
)
LIVE = ["pending", "running", "stopping", "stopped", "shutting-down"]
#: What the task asks: an orphan is gone within two minutes of its launch.
ORPHAN_BOUND = 120.0


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(
    tmp_path_factory: pytest.TempPathFactory, hypervisor: Hypervisor, proxy: FaultProxy
) -> AsyncIterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("seed")
    catalog = tmp / "catalog.csv"
    catalog.write_text(CATALOG)
    async with fleet_server(
        tmp / "state", CONFIG, FLEET, hypervisor, cleanup="fleet", safety_net_interval=2.0, aws_catalog=catalog
    ) as s:
        yield s


class Sampler:
    """Counts, every 0.1 s until stopped, the fleet's live instances in EC2 (a thread of its own) and its
    unterminated instances in corral (``instances/list``); the highest of each."""

    def __init__(self, moto: MotoEC2, server: RunningServer) -> None:
        self.moto, self.server = moto, server
        self.ec2_peak = self.corral_peak = self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._ec2_loop, daemon=True)
        self._task: asyncio.Task[None] | None = None

    def _ec2_loop(self) -> None:
        ec2 = self.moto.client()
        while not self._stop.is_set():
            found = ec2.describe_instances(
                Filters=[
                    {"Name": "tag:corral_fleet", "Values": ["seedfl"]},
                    {"Name": "instance-state-name", "Values": LIVE},
                ]
            )
            self.ec2_peak = max(self.ec2_peak, sum(len(r["Instances"]) for r in found["Reservations"]))
            self.samples += 1
            self._stop.wait(0.1)

    async def _corral_loop(self) -> None:
        async with self.server.client() as c:
            while not self._stop.is_set():
                listed = (await c.post("/api/instances/list", json={})).json()
                live = [i for i in listed if i["fleet_name"] == "seedfl" and i["status"] != "terminated"]
                self.corral_peak = max(self.corral_peak, len(live))
                await asyncio.sleep(0.1)

    def start(self) -> Sampler:
        self._thread.start()
        self._task = asyncio.create_task(self._corral_loop())
        return self

    async def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self._task is not None:
            await self._task


def _task(i: int) -> dict[str, Any]:
    """The bug report's body, with a command that says where it ran (and lasts a second: an echo alone can
    end within milliseconds of its placement, which costs less than dstack's rounding shows)."""
    conf = {"type": "task", "name": f"seed-{i}", "commands": [f"echo out-{i} on $(hostname -I)", "sleep 1"],
            "fleets": ["seedfl"], "creation_policy": "reuse-or-create", "resources": {"cpu": "2.."}}  # fmt: skip
    return {"force": True, "plan": {"run_spec": {"configuration": conf}}}


def _launch_orphan(moto: MotoEC2, server_id: str) -> str:
    ec2 = moto.client()
    subnet = ec2.describe_subnets(Filters=[{"Name": "cidr-block", "Values": [moto.cidr]}])["Subnets"][0]["SubnetId"]
    tags = {"owner": "corral", "corral_server": server_id, "corral_instance": "no-such-row"}
    reply = ec2.run_instances(
        ImageId=AMIS[0]["ami_id"], InstanceType="m7i.large", MinCount=1, MaxCount=1, SubnetId=subnet,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
    )  # fmt: skip
    return str(reply["Instances"][0]["InstanceId"])


def _at(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


async def _output(c: Any, name: str, sub: dict[str, Any]) -> str:
    r = await c.post("/api/project/main/logs/poll", json={"run_name": name, "job_submission_id": sub["id"]})
    return "".join(base64.b64decode(e["message"]).decode() for e in r.json()["logs"])


def _dstack_ps(url: str, token: str) -> str:
    """``dstack ps -a`` of the official client (0.22.5) against the server."""
    dstack = str(client_venv() / "bin" / "dstack")
    with short_home() as home:
        env = cli_env(home)
        add = ["project", "add", "--name", "main", "--url", url, "--token", token, "-y"]
        done = subprocess.run([dstack, *add], env=env, capture_output=True, text=True, timeout=120, cwd=home)
        assert done.returncode == 0, done.stdout + done.stderr
        done = subprocess.run([dstack, "ps", "-a"], env=env, capture_output=True, text=True, timeout=120, cwd=home)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout


async def test_the_seed_on_ec2_holds_nodes_max_and_says_where_and_what_each_run_cost(
    server: RunningServer, hypervisor: Hypervisor
) -> None:
    moto = hypervisor.moto
    assert any(a["name"] == UBUNTU_2204_NAME for a in AMIS)  # moto has AWS's real Ubuntu image
    me = await cloud_backends.server_id(server.ctx.db)
    orphan, orphan_launched = _launch_orphan(moto, me), time.monotonic()
    sampler = Sampler(moto, server).start()
    async with server.client() as c:
        for i in range(10):
            r = await c.post("/api/project/main/runs/apply", json=_task(i))
            assert r.status_code == 200, r.text
        rs = await asyncio.gather(*(c.post("/api/project/main/runs/apply", json=_task(i)) for i in range(10, 30)))
        assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200]
        runs = [await finished_run(c, f"seed-{i}", timeout=240) for i in range(30)]
        await sampler.stop()
        listed = {i["id"]: i for i in (await c.post("/api/instances/list", json={})).json()}
        outputs = [await _output(c, f"seed-{i}", run["jobs"][0]["job_submissions"][-1]) for i, run in enumerate(runs)]
    assert sampler.samples > 10 and 1 <= sampler.ec2_peak <= NODES_MAX and 1 <= sampler.corral_peak <= NODES_MAX
    assert not hypervisor.errors, hypervisor.errors

    found = moto.client().describe_instances(Filters=[{"Name": "tag:corral_fleet", "Values": ["seedfl"]}])
    fleet_instances = {i["InstanceId"]: i for r in found["Reservations"] for i in r["Instances"]}
    for i, (run, out) in enumerate(zip(runs, outputs, strict=True)):
        (job,) = run["jobs"]
        (sub,) = job["job_submissions"]
        jpd = sub["job_provisioning_data"]
        assert run["status"] == "done", (i, sub.get("termination_reason_message"), sub.get("status_message"))
        # said as dstack says it: the backend, the region, EC2's id and the price the job was placed at
        assert (jpd["backend"], jpd["region"], jpd["price"]) == ("aws", REGION, PRICE), jpd
        ec2 = fleet_instances[jpd["instance_id"]]
        # it ran on the fake host booted at its instance's private IP
        assert ec2["PrivateIpAddress"] == jpd["internal_ip"] and out.split() == [f"out-{i}", "on", jpd["internal_ip"]]
        # its cost: the price for its time on the instance, which is within its life
        most = PRICE * (_at(sub["finished_at"]) - _at(sub["submitted_at"])) / 3600
        assert 0 < run["cost"] <= round(most, 4) + 0.0001, (run["cost"], most)
    assert 1 <= len(fleet_instances) <= NODES_MAX
    for ec2 in fleet_instances.values():
        tags = {t["Key"]: t["Value"] for t in ec2["Tags"]}
        row = tags["corral_instance"]
        assert row in listed and listed[row]["backend"] == "aws"
        assert (tags["owner"], tags["corral_server"], tags["corral_project"], tags["corral_fleet"]) == (
            "corral", me, "main", "seedfl"
        )  # fmt: skip
        assert re.fullmatch(rf"corral-{re.escape(row)}-\d+", ec2["ClientToken"]), ec2["ClientToken"]

    # dstack's own ps: each run on aws in its region, at its price
    table = await asyncio.to_thread(_dstack_ps, server.url, server.token)  # the server answers on this loop
    assert table.count(f"aws ({REGION})") >= 30 and "$3.6" in table, table

    # the orphan (tagged with this server's id, no row) went within two minutes of its launch
    async def reaped() -> bool:
        state = moto.client().describe_instances(InstanceIds=[orphan])["Reservations"][0]["Instances"][0]["State"]
        return str(state["Name"]) in ("shutting-down", "terminated")

    while not await reaped() and time.monotonic() - orphan_launched < ORPHAN_BOUND:
        await asyncio.sleep(1.0)
    assert await reaped(), f"the orphan {orphan} still runs {ORPHAN_BOUND:g}s after its launch"
