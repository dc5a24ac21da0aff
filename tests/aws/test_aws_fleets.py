"""A cloud fleet on EC2 (moto), end to end: config.yml's ``type: aws`` block with its credentials checked
and sealed, priced offers, instances launched with corral's tags and client tokens and reached over SSH
(fake hosts at their private IPs, the UserData run in them), the seed's scenario counted in EC2 itself,
adoption after a crash, and termination confirmed by DescribeInstances."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aws_server import fleet_server
from moto_harness import AMIS, REGION, VPC_NAME, FaultProxy, Hypervisor, MotoEC2

from corral.backends.aws import ec2
from corral.backends.aws.launch import user_data
from corral.domain.records import InstanceRec
from corral.domain.statuses import InstanceStatus
from corral.scheduler.codec import offer_to_json
from corral.services import cloud_backends
from corral.workers.orphans import OrphanReaper
from server_harness import RunningServer, finished_run

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


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(
    tmp_path_factory: pytest.TempPathFactory, hypervisor: Hypervisor, proxy: FaultProxy
) -> AsyncIterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("awsserver")
    async with fleet_server(tmp, CONFIG, FLEET, hypervisor, cleanup="all", safety_net_interval=2.0) as s:
        yield s


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


async def test_seed_scenario_holds_nodes_max_in_ec2(
    server: RunningServer, hypervisor: Hypervisor, proxy: FaultProxy
) -> None:
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
    mine = [{"Key": "owner", "Value": "corral"}, {"Key": "corral_fleet", "Value": "awsfl"}]
    tagged = [i for i in hypervisor.moto.instances() if all(t in (i.get("Tags") or []) for t in mine)]
    assert 1 <= len(tagged) <= 3
    # zone a refused each launch that tried it, once (no botocore retries of a launch); launches that came
    # after a refusal skipped it (cached)
    assert 1 <= len(proxy.refused) <= len(tagged)
    for inst in tagged:
        tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
        assert tags["corral_project"] == "main" and tags["corral_fleet"] == "awsfl" and tags["team"] == "ml"
        assert tags["corral_server"] and tags["corral_instance"]
        # zone a answered InsufficientInstanceCapacity: a launch that tried it made it on its second attempt
        # (zone b, a new token); one that came after skipped zone a (cached) and made it on its first
        refused_first = any(lt.token == f"corral-{tags['corral_instance']}-1" and lt.error for lt in proxy.launches)
        assert inst["ClientToken"] == f"corral-{tags['corral_instance']}-{2 if refused_first else 1}"
        assert inst["Placement"]["AvailabilityZone"] == f"{REGION}b"
        assert inst["InstanceType"] == "t3.large"  # the cheapest type with 2 CPUs and 8 GB in the catalogue


def _launch_by_hand(moto: MotoEC2, tags: dict[str, str], user_data: str = "") -> str:
    ec2 = moto.client()
    subnet = ec2.describe_subnets(Filters=[{"Name": "cidr-block", "Values": [moto.cidr]}])["Subnets"][0]["SubnetId"]
    reply = ec2.run_instances(
        ImageId=AMIS[0]["ami_id"],
        InstanceType="m7i.large",
        MinCount=1,
        MaxCount=1,
        SubnetId=subnet,
        UserData=user_data,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
    )
    return str(reply["Instances"][0]["InstanceId"])


def _state(moto: MotoEC2, instance_id: str) -> str:
    got = moto.client().describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    return str(got["State"]["Name"])


async def test_orphans_are_reaped_and_untagged_instances_left_alone(
    server: RunningServer, hypervisor: Hypervisor
) -> None:
    moto = hypervisor.moto
    me = await cloud_backends.server_id(server.ctx.db)
    orphan = _launch_by_hand(moto, {"owner": "corral", "corral_server": me, "corral_instance": "no-such-row"})
    other_server = _launch_by_hand(moto, {"owner": "corral", "corral_server": "another", "corral_instance": "x"})
    untagged = _launch_by_hand(moto, {"Name": "not-corral"})
    young = OrphanReaper(dataclasses.replace(server.ctx, settings=dataclasses.replace(server.ctx.settings)))
    assert await young.pass_once(force=True) == 0  # within CORRAL_ORPHAN_GRACE (a minute)
    settings = dataclasses.replace(server.ctx.settings, orphan_grace=0.0, orphan_action="report")
    assert await OrphanReaper(dataclasses.replace(server.ctx, settings=settings)).pass_once(force=True) == 1
    assert _state(moto, orphan) == "running"  # reported only
    settings = dataclasses.replace(settings, orphan_action="terminate")
    assert await OrphanReaper(dataclasses.replace(server.ctx, settings=settings)).pass_once(force=True) == 1
    assert _state(moto, orphan) in ("shutting-down", "terminated")
    assert _state(moto, untagged) == _state(moto, other_server) == "running"
    for i in (untagged, other_server):
        moto.client().terminate_instances(InstanceIds=[i])


async def test_a_launch_interrupted_by_a_crash_is_adopted_by_its_tag(
    server: RunningServer, hypervisor: Hypervisor
) -> None:
    """The server died after RunInstances, before its commit: the row is still pending, EC2 has the
    instance. Provisioning the row again finds it by its ``corral_instance`` tag and launches nothing."""
    compute = server.ctx.computes["aws"]
    project = await compute.project("main")
    row_id = str(uuid.uuid4())
    ec2_id = _launch_by_hand(
        hypervisor.moto,
        {"owner": "corral", "corral_server": await cloud_backends.server_id(server.ctx.db), "corral_instance": row_id},
        user_data=user_data([project.ssh_public_key]),
    )
    offer = next(o for o in compute.offers() if o.instance_type == "m7i.large" and not o.resources.spot)
    rec = InstanceRec(
        id=row_id, project_id="p", project_name="main", fleet_id=None, fleet_name="awsfl", name="awsfl-9",
        instance_num=9, status=InstanceStatus.PENDING, unreachable=False, backend="aws", region=REGION,
        price=offer.price,
        offer=offer_to_json(offer), total_blocks=1, busy_blocks=0, hostname=None, agent=None, created_at=0.0,
        started_at=None, finished_at=None, last_job_finished_at=None, idle_duration=None,
        termination_reason=None, termination_reason_message=None,
    )  # fmt: skip
    launches = compute.session.calls.get("run_instances", 0)
    provisioned = await compute.create_instance(rec)
    assert compute.session.calls.get("run_instances", 0) == launches
    assert provisioned.agent.connection["aws"]["instance_id"] == ec2_id
    assert provisioned.resources.cpus == 2 and provisioned.resources.memory_mib == 8192  # the type's, not the host's
    await compute.terminate_instance(row_id, provisioned.agent)  # returns once EC2 says terminated
    assert _state(hypervisor.moto, ec2_id) == "terminated"


async def test_backends_api_round_trip_and_refusals(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    aws = {"type": "aws", "creds": {"type": "access_key", "access_key": "AKIAAPI", "secret_key": "api-secret"},
           "regions": [REGION], "vpc_name": VPC_NAME, "public_ips": False}  # fmt: skip
    P = "/api/project/team2/backends"
    async with server.client() as c:
        assert "aws" in (await c.post("/api/backends/list_types")).json()
        assert (await c.post("/api/projects/create", json={"project_name": "team2"})).status_code == 200
        r = await c.post(P + "/create", json={"type": "local"})
        assert r.status_code == 400 and "config.yml" in r.text
        r = await c.post(P + "/create", json={**aws, "regions": ["nowhere"]})
        assert r.status_code == 400 and "regions" in r.text
        r = await c.post(P + "/create", json=aws)
        assert r.status_code == 200, r.text
        assert "api-secret" not in r.text and "AKIAAPI" not in r.text and r.json()["vpc_name"] == VPC_NAME
        assert (await c.post(P + "/create", json=aws)).status_code == 400  # exists
        for path in ("/aws/config_info", "/aws/get_yaml"):
            r = await c.post(P + path)
            assert r.status_code == 200 and "api-secret" not in r.text and "AKIAAPI" not in r.text, r.text
        assert "vpc_name: corral-test" in (await c.post(P + "/aws/get_yaml")).json()["config_yaml"]
        async with server.ctx.db.read() as conn:
            raw = (await conn.exec_driver_sql("SELECT backends FROM projects WHERE name = 'team2'")).scalar_one()
        assert "api-secret" not in raw and "enc:v1:" in raw
        yaml_text = (
            "type: aws\ncreds: {type: access_key, access_key: AKIAAPI, secret_key: api-secret}\nregions: [eu-west-1]\n"
        )
        assert (await c.post(P + "/update_yaml", json={"config_yaml": yaml_text})).status_code == 200
        assert (await c.post(P + "/aws/config_info")).json()["regions"] == ["eu-west-1"]
        monkeypatch.setenv("AWS_ENDPOINT_URL_STS", "http://127.0.0.1:9")  # nothing answers: the check fails
        r = await c.post(P + "/update", json=aws)
        assert r.status_code == 400 and "creds" in r.text
        monkeypatch.delenv("AWS_ENDPOINT_URL_STS")
        assert (await c.post(P + "/aws/config_info")).json()["regions"] == ["eu-west-1"]  # nothing written
        assert (await c.post(P + "/delete", json={"backends_names": ["aws"]})).status_code == 200
        assert (await c.post(P + "/aws/config_info")).status_code == 400
        # main's aws backend still has the seed scenario's instances: deleting it would leave them running
        r = await c.post("/api/project/main/backends/delete", json={"backends_names": ["aws"]})
        assert r.status_code == 400 and "not terminated" in r.text


async def test_a_custom_vpc_without_a_usable_subnet_or_a_missing_image_is_refused_when_the_backend_is_added(
    server: RunningServer, hypervisor: Hypervisor
) -> None:
    """The test VPC has private subnets routed through a NAT gateway and a public one: both modes have a
    subnet. A VPC whose only subnet has no way out suits neither; an ``os_images`` AMI that is not there is
    refused too -- before any launch, naming the fields."""
    doc = {"type": "aws", "creds": {"type": "access_key", "access_key": "AKIANAT", "secret_key": "nat-secret"},
           "regions": [REGION], "vpc_name": VPC_NAME, "public_ips": False}  # fmt: skip
    assert await cloud_backends.check_aws(doc) == []
    assert await cloud_backends.check_aws({**doc, "public_ips": True}) == []
    ec2 = hypervisor.moto.client()
    vpc = ec2.create_vpc(CidrBlock="10.215.0.0/16")["Vpc"]["VpcId"]
    ec2.create_tags(Resources=[vpc], Tags=[{"Key": "Name", "Value": "corral-closed"}])
    ec2.create_subnet(VpcId=vpc, CidrBlock="10.215.1.0/24", AvailabilityZone=f"{REGION}a")
    for public_ips, route in ((False, "NAT gateway"), (True, "internet gateway")):
        with pytest.raises(cloud_backends.BackendInvalid) as e:
            await cloud_backends.check_aws({**doc, "vpc_name": "corral-closed", "public_ips": public_ips})
        assert vpc in str(e.value) and "(vpc_name)" in str(e.value) and route in str(e.value)
        assert "public_ips" in str(e.value)
    by_id = {k: v for k, v in doc.items() if k != "vpc_name"} | {"vpc_ids": {REGION: vpc}}
    with pytest.raises(cloud_backends.BackendInvalid, match=r"\(vpc_ids\)"):
        await cloud_backends.check_aws(by_id)
    with pytest.raises(cloud_backends.BackendInvalid, match=r"no AMI named 'no-such-ami-\*' .*\(os_images\)"):
        await cloud_backends.check_aws({**doc, "os_images": {"cpu": {"name": "no-such-ami-*", "user": "ubuntu"}}})


async def test_the_projects_security_group_carries_the_backends_tags(hypervisor: Hypervisor) -> None:
    client = hypervisor.moto.client()
    vpc = client.create_vpc(CidrBlock="10.216.0.0/16")["Vpc"]["VpcId"]
    made = ec2.security_group(client, vpc, "tagged", {"team": "ml", "owner": "someone"})
    (group,) = client.describe_security_groups(GroupIds=[made])["SecurityGroups"]
    tags = {t["Key"]: t["Value"] for t in group["Tags"]}
    assert tags == {"team": "ml", "owner": "corral", "corral_project": "tagged"}  # corral's own win
    assert ec2.security_group(client, vpc, "tagged", {"team": "ml"}) == made  # found, not made again
