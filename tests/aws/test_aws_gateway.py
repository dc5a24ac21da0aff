"""A gateway on AWS, run for real by the server against moto seeded from the backend's facts (``facts.py``): its VM
launched through the backend's own image lookup, subnet choice by route table and tags, with a ClientToken of
the gateway's id; a fake host booted at the VM's private IP (the hypervisor) gets the gateway's process; pebble
answers ``*.<domain>`` with that address and issues the certificate by HTTP-01; a service is served at
``https://<run>.<domain>`` (pebble's root only verifies it); deleting the gateway terminates the VM; and a
gateway VM whose row is gone is reaped by the orphan reaper within its grace."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import sqlalchemy as sa
from facts import CANONICAL_OWNER, INSUFFICIENT_CAPACITY, UBUNTU_2204_NAME, VCPU_LIMIT
from moto_harness import AMIS, REGION, VPC_NAME, FaultProxy, Hypervisor, MotoEC2

import gateway_client
from corral.backends.base import GatewayHost, GatewayProvisioner, GatewaySpec, ProvisioningError
from corral.backends.ssh_secrets import new_keypair
from pebble_harness import PebbleLab
from server_harness import RunningServer, fleet_body, get_run, make_settings, running_server, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="module")

G = "/api/project/main/gateways"
DOMAIN = "gw.aws.example.test"
CONFIG = f"""
projects:
  - name: main
    backends:
      - type: local
      - type: aws
        creds: {{type: access_key, access_key: AKIAGATEWAYTEST, secret_key: gateway-secret-value}}
        regions: [{REGION}]
        vpc_name: {VPC_NAME}
        public_ips: false
        tags: {{team: edge}}
"""
#: What dstack's gateway VM is (reference: dstack 0.22.5 ``core/backends/aws``): ``t3.micro`` unless the
#: configuration says otherwise, in a security group open to the world on SSH, HTTP and HTTPS.
DEFAULT_TYPE = "t3.micro"
OPEN_PORTS = {22, 80, 443}
#: The grace and interval of the reaper in this module (an orphan is gone within their sum, and a bit).
GRACE, INTERVAL = 10.0, 2.0
APP = base64.b64encode((Path(__file__).parent.parent / "proxy" / "replica_app.py").read_bytes()).decode()


@pytest.fixture(scope="module")
def public_zone_b(moto: MotoEC2, vpc: tuple[str, str, str]) -> Iterator[str]:
    """Zone b's subnet (the fake hosts' network) routed to the internet gateway for this module, as a gateway
    with a public IP needs it (the backend picks subnets by their route tables); private again afterwards."""
    ec2 = moto.client()
    _vpc, _a, zone_b = vpc
    tables = ec2.describe_route_tables(Filters=[{"Name": "association.subnet-id", "Values": [moto.public_subnet]}])[
        "RouteTables"
    ]
    assoc = ec2.associate_route_table(RouteTableId=tables[0]["RouteTableId"], SubnetId=zone_b)["AssociationId"]
    try:
        yield zone_b
    finally:
        ec2.disassociate_route_table(AssociationId=assoc)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PebbleLab]:
    pebble = PebbleLab(tmp_path_factory.mktemp("pebble")).start()
    try:
        yield pebble
    finally:
        pebble.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(
    tmp_path_factory: pytest.TempPathFactory,
    hypervisor: Hypervisor,
    public_zone_b: str,
    lab: PebbleLab,
    proxy: FaultProxy,
) -> AsyncIterator[RunningServer]:
    settings = make_settings(
        tmp_path_factory.mktemp("gw-aws"),
        safety_net_interval=1.0, provisioning_timeout=90.0, ssh_connect_timeout=3.0,
        acme_server=lab.directory_url, acme_ca_bundle=lab.ca_bundle, sandbox="on",
        orphan_grace=GRACE, orphan_interval=INTERVAL,
    )  # fmt: skip
    settings.server_dir.mkdir(parents=True)
    (settings.server_dir / "config.yml").write_text(CONFIG)
    async with running_server(settings) as s:
        yield s


def _gateway_vms(moto: MotoEC2, gateway_id: str) -> list[dict[str, Any]]:
    found = moto.client().describe_instances(Filters=[{"Name": "tag:corral_gateway", "Values": [gateway_id]}])
    return [i for r in found["Reservations"] for i in r["Instances"]]


async def _gateway(c: httpx.AsyncClient, name: str, status: str) -> dict[str, Any] | None:
    r = await c.post(G + "/get", json={"name": name})
    if r.status_code != 200:
        return None
    g = dict(r.json())
    if g["status"] == "failed" and status != "failed":
        raise AssertionError(f"the gateway failed: {g['status_message']}")
    return g if g["status"] == status else None


async def _apply(c: httpx.AsyncClient, conf: dict[str, Any]) -> httpx.Response:
    return await c.post(G + "/apply", json={"plan": {"spec": {"configuration": conf}}, "force": False})


async def _start_service(c: httpx.AsyncClient, name: str, gateway: str) -> dict[str, Any]:
    r = await c.post("/api/project/main/fleets/apply", json=fleet_body(name="local", nodes="0..1"))
    assert r.status_code == 200, r.text
    conf = {
        "type": "service", "name": name, "port": 8000, "gateway": gateway,
        "commands": [f"echo {APP} | base64 -d > app.py", "exec python3 app.py 8000"],
        "resources": {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."}, "fleets": ["local"],
    }  # fmt: skip
    r = await c.post(
        "/api/project/main/runs/apply", json={"force": False, "plan": {"run_spec": {"configuration": conf}}}
    )
    assert r.status_code == 200, r.text

    async def ready() -> bool:
        run = await get_run(c, name)
        return any(j["job_submissions"][-1].get("corral_ready") for j in run["jobs"])

    await wait_for(ready, timeout=90, interval=0.3)
    return await get_run(c, name)


async def test_what_an_aws_gateway_refuses(server: RunningServer) -> None:
    base = {"type": "gateway", "name": "no", "backend": "aws", "region": REGION, "domain": DOMAIN}
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"public_ip": False}, "lets-encrypt certificate type is not supported for private gateways"),
        ({"load_balancer": {"type": "alb"}}, "is not supported by corral's aws gateways"),
        ({"certificate": {"type": "acm", "arn": "arn:aws:acm:x"}}, "The `acm` certificate type is not supported"),
        ({"region": "eu-west-1"}, "region: eu-west-1 is not among the aws backend's regions"),
        ({"tags": {"corral_server": "x"}}, "tags: corral_server is corral's own tag"),
    ]
    async with server.client() as c:
        for change, said in refusals:
            r = await _apply(c, {**base, **change})
            assert r.status_code == 400 and said in r.text, (change, r.text)
        assert (await c.post(G + "/list", json={})).json() == []


async def test_a_gateway_on_its_own_vm_serves_over_tls_and_deleting_it_terminates_the_vm(
    server: RunningServer, moto: MotoEC2, hypervisor: Hypervisor, public_zone_b: str, lab: PebbleLab, tmp_path: Path
) -> None:
    root = tmp_path / "pebble-root.pem"
    root.write_text(lab.root_pem())
    host = f"svc.{DOMAIN}"
    async with server.client() as c:
        conf = {"type": "gateway", "name": "gw", "backend": "aws", "region": REGION, "domain": DOMAIN,
                "tags": {"cost": "gateways"}}  # fmt: skip
        r = await _apply(c, conf)
        assert r.status_code == 200, r.text
        gw = await wait_for(lambda: _gateway(c, "gw", "running"), timeout=150, interval=0.5)
        (vm,) = _gateway_vms(moto, gw["id"])
        tags = {t["Key"]: t["Value"] for t in vm["Tags"]}
        # launched as instances are: the server's and the row's tags, the backend's and the gateway's own
        assert tags["corral_instance"] == gw["id"] and tags["corral_project"] == "main" and tags["owner"] == "corral"
        assert (tags["team"], tags["cost"]) == ("edge", "gateways")
        assert vm["ClientToken"].startswith(f"corral-{gw['id']}-")
        # the backend's image lookup (the newest Ubuntu 22.04 of Canonical), its subnet choice (a public one)
        ubuntu = next(a for a in AMIS if a["name"] == UBUNTU_2204_NAME)
        assert ubuntu["owner_id"] == CANONICAL_OWNER and vm["ImageId"] == ubuntu["ami_id"]
        assert vm["InstanceType"] == DEFAULT_TYPE and vm["SubnetId"] == public_zone_b
        groups = moto.client().describe_security_groups(GroupIds=[g["GroupId"] for g in vm["SecurityGroups"]])
        (group,) = [g for g in groups["SecurityGroups"] if g["GroupName"] == "corral_gw_main"]
        opened = {p["FromPort"] for p in group["IpPermissions"] if {"CidrIp": "0.0.0.0/0"} in p["IpRanges"]}
        assert opened == OPEN_PORTS, group
        # dstack's answer: the gateway's address is its VM's public IP
        (replica,) = gw["replicas"]
        assert replica["backend"] == "aws" and replica["hostname"] == vm.get("PublicIpAddress"), (replica, vm)
        # its own key, kept sealed
        async with server.ctx.db.read() as conn:
            from corral.store import gateways as gateway_store

            rec = await gateway_store.get(conn, gw["id"])
        assert rec is not None and rec.connection is not None
        assert str(rec.connection["vm_key"]).startswith("enc:") and "PRIVATE KEY" not in str(rec.connection)
        aws = server.ctx.computes["aws"]
        assert isinstance(aws, GatewayProvisioner)  # and it says the address as EC2 has it now
        assert (
            await aws.gateway_address(GatewayHost(replica["hostname"], rec.connection["vm"])) == vm["PublicIpAddress"]
        )

        ip = vm["PrivateIpAddress"]  # the fake host booted there (the lab's DNS says the domain is there)
        lab.set_default_ipv4(ip)
        run = await _start_service(c, "svc", "gw")  # published on the gateway, as dstack's service says it
        assert run["service"]["url"] == f"https://{host}", run["service"]

        async def served() -> gateway_client.Answer | None:
            with contextlib.suppress(OSError, ssl.SSLError, asyncio.TimeoutError):
                got = await gateway_client.request(
                    ip, host, "/whoami", cafile=str(root), headers={"Authorization": f"Bearer {server.token}"}
                )
                return got if got.status == 200 else None
            return None

        await wait_for(served, timeout=90, interval=0.5)
        with pytest.raises(ssl.SSLCertVerificationError):
            await gateway_client.request(ip, host, "/whoami", cafile=None)  # the system store refuses pebble's root

        r = await c.post("/api/project/main/runs/stop", json={"runs_names": ["svc"], "abort": True})
        assert r.status_code == 200, r.text
        await wait_for(lambda: _finished(c, "svc"), timeout=60)
        r = await c.post(G + "/delete", json={"names": ["gw"]})
        assert r.status_code == 200, r.text
        await wait_for(lambda: _gone(c, "gw"), timeout=90)
        (vm,) = _gateway_vms(moto, gw["id"])
        assert vm["State"]["Name"] in ("shutting-down", "terminated"), vm["State"]
    assert not hypervisor.errors, hypervisor.errors


async def test_a_gateway_vm_whose_row_is_gone_is_reaped_within_the_grace(
    server: RunningServer, moto: MotoEC2, hypervisor: Hypervisor
) -> None:
    conf = {"type": "gateway", "name": "gw-lost", "backend": "aws", "region": REGION, "certificate": None}
    async with server.client() as c:
        r = await _apply(c, conf)
        assert r.status_code == 200, r.text
        gw = await wait_for(lambda: _gateway(c, "gw-lost", "running"), timeout=150, interval=0.5)
    (vm,) = _gateway_vms(moto, gw["id"])
    # a live gateway's VM is kept by the reaper's passes
    await asyncio.sleep(GRACE + 2 * INTERVAL)
    (vm,) = _gateway_vms(moto, gw["id"])
    assert vm["State"]["Name"] == "running"
    from corral.store.tables import gateways

    async with server.ctx.db.write() as conn:  # the row is lost (a restore of an older database...)
        await conn.execute(sa.delete(gateways).where(gateways.c.id == gw["id"]))
    lost_at = time.monotonic()

    async def reaped() -> bool:
        (vm,) = _gateway_vms(moto, gw["id"])
        return vm["State"]["Name"] in ("shutting-down", "terminated")

    await wait_for(reaped, timeout=GRACE + 4 * INTERVAL + 20)
    launched = vm["LaunchTime"].timestamp()
    assert time.monotonic() - lost_at <= GRACE + 4 * INTERVAL + 20 and launched > 0


async def test_a_launch_ec2_refuses_fails_the_gateway_with_ec2s_reason_and_capacity_tries_another_zone(
    server: RunningServer, moto: MotoEC2, proxy: FaultProxy, public_zone_b: str
) -> None:
    seen = len(proxy.launches)
    # no capacity in zone b: the next public zone's subnet is tried (c, where no fake host answers: not run)
    proxy.fault = lambda lt: INSUFFICIENT_CAPACITY if lt.subnet == public_zone_b else VCPU_LIMIT
    try:
        conf = {"type": "gateway", "name": "gw-quota", "backend": "aws", "region": REGION, "certificate": None}
        async with server.client() as c:
            r = await _apply(c, conf)
            assert r.status_code == 200, r.text
            gw = await wait_for(lambda: _gateway(c, "gw-quota", "failed"), timeout=60, interval=0.5)
            tried = proxy.launches[seen:]
            assert [lt.subnet for lt in tried] == [public_zone_b, moto.public_subnet], tried
            assert [lt.error for lt in tried] == [INSUFFICIENT_CAPACITY, VCPU_LIMIT]
            assert all(lt.token.startswith(f"corral-{gw['id']}-") for lt in tried)
            assert gw["status_message"].startswith("Failed to provision the gateway: aws: the gateway's VM: "), gw
            assert VCPU_LIMIT in gw["status_message"] and _gateway_vms(moto, gw["id"]) == []
            r = await c.post(G + "/delete", json={"names": ["gw-quota"]})
            assert r.status_code == 200, r.text
            await wait_for(lambda: _gone(c, "gw-quota"), timeout=30)
    finally:
        proxy.fault = None


async def test_a_gateway_vm_launched_before_a_restart_is_adopted_not_launched_again(
    server: RunningServer, moto: MotoEC2, proxy: FaultProxy
) -> None:
    aws = server.ctx.computes["aws"]
    assert isinstance(aws, GatewayProvisioner)
    _private, public = new_keypair("test")
    spec = GatewaySpec("gw-adopt-row", "main", REGION, name="adopt", public_key=public, private_key="sealed")
    seen = len(proxy.launches)
    first = await aws.create_gateway(spec)
    again = await aws.create_gateway(spec)  # as the worker does after a restart in the middle of the launch
    assert first == again and len(proxy.launches) == seen + 1
    (vm,) = _gateway_vms(moto, "gw-adopt-row")
    assert vm["InstanceId"] == first.connection["aws"]["instance_id"] and first.address == vm["PublicIpAddress"]
    await aws.terminate_gateway(spec, again)  # returns once EC2 says terminated
    (vm,) = _gateway_vms(moto, "gw-adopt-row")
    assert vm["State"]["Name"] == "terminated"
    await aws.terminate_gateway(spec, again)  # gone already: a no-op


async def test_a_private_gateway_launches_in_a_subnet_routed_through_nat_without_a_public_ip(
    server: RunningServer, proxy: FaultProxy, vpc: tuple[str, str, str]
) -> None:
    """``public_ip: false``: the backend's subnet choice for private instances (zone a's, routed through the NAT
    gateway; the proxy has no capacity there, so the launch stops at its answer) and no public address."""
    aws = server.ctx.computes["aws"]
    assert isinstance(aws, GatewayProvisioner)
    _vpc, zone_a, _zone_b = vpc
    spec = GatewaySpec("gw-private-row", "main", REGION, public_ip=False, name="private", public_key="k")
    seen = len(proxy.launches)
    with pytest.raises(ProvisioningError, match="no zone of us-east-1 could launch the gateway's VM") as got:
        await aws.create_gateway(spec)
    assert got.value.kind == "no_capacity"  # tried again by the worker until the provisioning timeout
    assert [(lt.subnet, lt.error) for lt in proxy.launches[seen:]] == [(zone_a, INSUFFICIENT_CAPACITY)]
    (form,) = [f for action, f in proxy.requests if action == "RunInstances"][-1:]
    assert form["NetworkInterface.1.AssociatePublicIpAddress"] == ["false"], form


async def _finished(c: httpx.AsyncClient, name: str) -> bool:
    return (await get_run(c, name))["status"] in ("done", "failed", "terminated")


async def _gone(c: httpx.AsyncClient, name: str) -> bool:
    return (await c.post(G + "/get", json={"name": name})).status_code != 200
