"""EC2 for the aws backend's tests: moto's server on loopback, a VPC whose one subnet is the fake hosts'
/24, and a watcher that plays the hypervisor.

The watcher polls DescribeInstances: for each new running instance tagged ``owner=corral`` it starts a fake
host (``fakehosts.FakeHosts.add``: its own network namespace at the instance's private IP, sshd) and runs
the instance's UserData in it as root, as cloud-init would; when the instance is terminated it removes
the host. It also samples how many instances are pending, running or shutting down (``peak``).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import facts
from ec2_extras import ACTIONS as EXTRA_ACTIONS
from ec2_extras import EC2Extras

from fakehosts import FakeHosts
from server_harness import free_port

REGION = "us-east-1"
VPC_NAME = "corral-test"


def _ami(ami_id: str, name: str, owner: str, created: str, root: str = facts.UBUNTU_ROOT_DEVICE) -> dict[str, Any]:
    return {
        "ami_id": ami_id,
        "name": name,
        "description": name,
        "owner_id": owner,
        "public": True,
        "virtualization_type": "hvm",
        "architecture": "x86_64",
        "state": "available",
        "platform": None,
        "root_device_type": "ebs",
        "root_device_name": root,
        "sriov": "simple",
        "creation_date": created,
    }


#: What moto's AMI list is replaced with (``MOTO_AMIS_PATH``): public images under their real owners and
#: names, as a region has them (``facts``, never corral's constants): Canonical's Ubuntu 22.04 and 24.04
#: (the newer one must not be taken for a 22.04), the Deep Learning Base GPU AMI, and Amazon Linux 2023 (its
#: root device is ``/dev/xvda``: an ``os_images`` choice).
AMIS = [
    _ami("ami-0c0ffee0c0ffee001", facts.UBUNTU_2204_NAME, facts.CANONICAL_OWNER, "2026-11-01T00:00:00.000Z"),
    _ami("ami-0c0ffee0c0ffee002", facts.UBUNTU_2404_NAME, facts.CANONICAL_OWNER, "2026-11-15T00:00:00.000Z"),
    _ami("ami-0c0ffee0c0ffee003", facts.DLAMI_NAME, facts.DLAMI_OWNER, "2026-10-06T00:00:00.000Z"),
    _ami(
        "ami-0c0ffee0c0ffee004",
        facts.AMAZON_LINUX_NAME,
        facts.AMAZON_LINUX_OWNER,
        "2026-11-01T00:00:00.000Z",
        root=facts.AMAZON_LINUX_ROOT_DEVICE,
    ),
]
COUNTED = ("pending", "running", "shutting-down")
EC2_XMLNS = "http://ec2.amazonaws.com/doc/2016-11-15/"


class MotoEC2:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.server: Any = None
        self.url = ""
        self.cidr = ""
        #: The test VPC's public subnet (zone c), made by ``make_vpc``.
        self.public_subnet = ""

    def start(self) -> MotoEC2:
        from moto.server import ThreadedMotoServer

        amis = self.base / "amis.json"
        amis.write_text(json.dumps(AMIS))
        os.environ["MOTO_AMIS_PATH"] = str(amis)
        port = free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.server.start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    def client(self, region: str = REGION) -> Any:
        import boto3

        return boto3.client(
            "ec2",
            endpoint_url=self.url,
            region_name=region,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def make_vpc(self, subnet: str) -> tuple[str, str, str]:
        """A VPC named ``VPC_NAME`` (10.213.0.0/16) as a private network is built: private subnets whose main
        route table sends 0.0.0.0/0 to a NAT gateway -- in zone ``a`` one where no host ever answers (the fault
        proxy refuses launches there), in zone ``b`` ``subnet``.0/24, the fake hosts' network -- and a public
        subnet in zone ``c`` (its own route table to an internet gateway) holding the NAT gateway. Returns
        (VPC, zone a's subnet, zone b's subnet)."""
        ec2 = self.client()
        self.cidr = f"{subnet}.0/24"
        empty = "10.213.0.0/24"  # fake hosts' nets are 10.213.40 and up
        vpc = ec2.create_vpc(CidrBlock="10.213.0.0/16")["Vpc"]["VpcId"]
        ec2.create_tags(Resources=[vpc], Tags=[{"Key": "Name", "Value": VPC_NAME}])
        a = ec2.create_subnet(VpcId=vpc, CidrBlock=empty, AvailabilityZone=f"{REGION}a")["Subnet"]["SubnetId"]
        b = ec2.create_subnet(VpcId=vpc, CidrBlock=self.cidr, AvailabilityZone=f"{REGION}b")["Subnet"]["SubnetId"]
        self.public_subnet = self._nat(ec2, vpc, "10.213.1.0/24", f"{REGION}c")
        return vpc, a, b

    def make_region_vpc(self, region: str) -> tuple[str, ...]:
        """A VPC named ``VPC_NAME`` in another ``region``, private subnets in each of two zones routed through a
        NAT gateway (no hosts there: launch tests only). Returns the private subnets."""
        ec2 = self.client(region)
        vpc = ec2.create_vpc(CidrBlock="10.214.0.0/16")["Vpc"]["VpcId"]
        ec2.create_tags(Resources=[vpc], Tags=[{"Key": "Name", "Value": VPC_NAME}])
        private = tuple(
            ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.214.{n}.0/24", AvailabilityZone=f"{region}{z}")["Subnet"][
                "SubnetId"
            ]
            for n, z in ((1, "a"), (2, "b"))
        )
        self._nat(ec2, vpc, "10.214.3.0/24", f"{region}c")
        return private

    @staticmethod
    def _nat(ec2: Any, vpc: str, cidr: str, zone: str) -> str:
        """A public subnet of ``vpc`` (routed to a new internet gateway) with a NAT gateway, and the VPC's main
        route table sending 0.0.0.0/0 to that NAT gateway: the public subnet's id."""
        igw = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
        ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc)
        public = ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=zone)["Subnet"]["SubnetId"]
        table = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
        ec2.create_route(RouteTableId=table, DestinationCidrBlock="0.0.0.0/0", GatewayId=igw)
        ec2.associate_route_table(RouteTableId=table, SubnetId=public)
        eip = ec2.allocate_address(Domain="vpc")["AllocationId"]
        nat = ec2.create_nat_gateway(SubnetId=public, AllocationId=eip)["NatGateway"]["NatGatewayId"]
        tables = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc]},
                                                    {"Name": "association.main", "Values": ["true"]}])  # fmt: skip
        main = tables["RouteTables"][0]["RouteTableId"]
        ec2.create_route(RouteTableId=main, DestinationCidrBlock="0.0.0.0/0", NatGatewayId=nat)
        return str(public)

    def instances(self, **filters: list[str]) -> list[dict[str, Any]]:
        f = [{"Name": k.replace("_", "-"), "Values": v} for k, v in filters.items()]
        pages = self.client().describe_instances(Filters=f) if f else self.client().describe_instances()
        return [i for r in pages["Reservations"] for i in r["Instances"]]


class Hypervisor:
    """Fake hosts for moto's instances (see the module's docstring)."""

    def __init__(self, moto: MotoEC2, hosts: FakeHosts, interval: float = 0.1) -> None:
        self.moto, self.hosts, self.interval = moto, hosts, interval
        self.by_instance: dict[str, str] = {}
        self.peak = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hypervisor", daemon=True)

    def start(self) -> Hypervisor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for name in list(self.by_instance.values()):
            self.hosts.remove(name)
        self.by_instance.clear()

    def reset_peak(self) -> None:
        self.peak = 0

    def _loop(self) -> None:
        ec2 = self.moto.client()
        while not self._stop.is_set():
            try:
                self._tick(ec2)
            except Exception as e:  # noted, and the test reads it
                self.errors.append(repr(e))
            self._stop.wait(self.interval)

    def _tick(self, ec2: Any) -> None:
        pages = ec2.describe_instances()
        items = [i for r in pages["Reservations"] for i in r["Instances"]]
        self.peak = max(self.peak, sum(1 for i in items if i["State"]["Name"] in COUNTED))
        # hosts of terminated instances go first: moto hands a terminated instance's private IP to the next
        for i in items:
            if i["State"]["Name"] in ("shutting-down", "terminated") and i["InstanceId"] in self.by_instance:
                self.hosts.remove(self.by_instance.pop(i["InstanceId"]))
        for i in items:
            iid, state, ip = i["InstanceId"], i["State"]["Name"], i.get("PrivateIpAddress") or ""
            if state == "running" and iid not in self.by_instance and ip.startswith(self.hosts.subnet + "."):
                name = f"i{ip.rsplit('.', 1)[1]}"
                self.by_instance[iid] = name
                self.hosts.add(name, ip)
                attr = ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")
                script = base64.b64decode((attr.get("UserData") or {}).get("Value") or b"")
                done = self.hosts.exec(name, "sh -s", input=script, timeout=30)
                if done.returncode != 0:
                    self.errors.append(f"user data of {iid}: {done.stderr.decode(errors='replace')}")


def wait_until(fn: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout}s")


@dataclass(frozen=True)
class Launch:
    """One RunInstances the proxy saw: where, what, its client token, and the error it answered (or "")."""

    region: str
    subnet: str
    instance_type: str
    token: str
    error: str
    #: ``MinCount``, ``Placement.GroupName`` and the capacity reservation targeted ("" when none).
    count: int = 1
    group: str = ""
    reservation: str = ""
    #: ``InstanceMarketOptions.MarketType`` ("" when none: on-demand).
    market: str = ""


#: What a fault rule decides for one RunInstances: an EC2 error code to answer, or None to let it through.
FaultRule = Callable[[Launch], "str | None"]


def _error_reply(code: str) -> bytes:
    return (
        f"<Response><Errors><Error><Code>{code}</Code><Message>injected by the test's fault proxy</Message>"
        "</Error></Errors><RequestID>fault-proxy</RequestID></Response>"
    ).encode()


class FaultProxy:
    """An HTTP proxy in front of moto that forwards every EC2 call, except that a RunInstances in
    ``blocked_subnets`` is answered with EC2's ``InsufficientInstanceCapacity``, one ``fault`` refuses is
    answered with the code it names (HTTP 400, or 500 for capacity, EC2's XML error), and with ``hold`` set
    a launch moto made is not answered until ``release`` is set (``launched`` says it was made): a server
    killed meanwhile never hears of its instance. Actions in ``swallow`` get an empty success and never
    reach moto. ``launches`` records every RunInstances, in order. ``extras`` answers what moto lacks
    (placement groups, capacity reservations: ``ec2_extras``)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.blocked_subnets: set[str] = set()
        self.refused: list[str] = []
        self.fault: FaultRule | None = None
        self.launches: list[Launch] = []
        #: Every call seen, by action (EC2's and STS's ``Action``, else the ``X-Amz-Target`` operation).
        self.calls: dict[str, int] = {}
        #: Each RunInstances moto answered 200: when, and ``calls`` then.
        self.made: list[tuple[float, dict[str, int]]] = []
        self.lock = threading.Lock()
        #: Actions answered with an empty success and not forwarded (EC2 "accepts" them; nothing happens).
        self.swallow: set[str] = set()
        #: The same for the calls this rule picks, by action and form (a detach EC2 takes and never does).
        self.swallow_when: Callable[[str, dict[str, list[str]]], bool] | None = None
        #: Every call seen, in order: its action and its form.
        self.requests: list[tuple[str, dict[str, list[str]]]] = []
        self.hold = False
        self.launched = threading.Event()
        self.release = threading.Event()
        self.server: Any = None
        self.url = ""
        self.extras = EC2Extras(states=self._states)

    def _states(self, ids: list[str]) -> dict[str, str]:
        import boto3

        ec2 = boto3.client("ec2", endpoint_url=self.upstream, region_name=REGION,
                           aws_access_key_id="testing", aws_secret_access_key="testing")  # fmt: skip
        found = ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": ids}])
        return {i["InstanceId"]: i["State"]["Name"] for r in found["Reservations"] for i in r["Instances"]}

    def start(self) -> FaultProxy:
        import http.client
        import urllib.parse
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        proxy = self
        up = urllib.parse.urlsplit(self.upstream)

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, data: bytes, headers: list[tuple[str, str]]) -> None:
                self.send_response(status)
                for k, v in headers:
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                form = urllib.parse.parse_qs(body.decode(errors="replace"))
                target = self.headers.get("X-Amz-Target") or ""  # JSON-protocol services (service quotas)
                action = (form.get("Action") or [""])[0] or target.rsplit(".", 1)[-1]
                with proxy.lock:
                    proxy.calls[action] = proxy.calls.get(action, 0) + 1
                    proxy.requests.append((action, form))
                if action in EXTRA_ACTIONS:
                    status, xml = proxy.extras.handle(action, form)
                    self._reply(status, xml, [("Content-Type", "text/xml")])
                    return
                if action in proxy.swallow or (proxy.swallow_when is not None and proxy.swallow_when(action, form)):
                    ok = f'<{action}Response xmlns="{EC2_XMLNS}"><requestId>fault-proxy</requestId></{action}Response>'
                    self._reply(200, ok.encode(), [("Content-Type", "text/xml")])
                    return
                launching = action == "RunInstances"
                if launching:
                    scope = re.search(r"Credential=[^/]+/[^/]+/([^/]+)/", self.headers.get("Authorization") or "")
                    launch = Launch(
                        region=scope.group(1) if scope else "",
                        subnet=(form.get("NetworkInterface.1.SubnetId") or form.get("SubnetId") or [""])[0],
                        instance_type=(form.get("InstanceType") or [""])[0],
                        token=(form.get("ClientToken") or [""])[0],
                        error="",
                        count=int((form.get("MinCount") or ["1"])[0]),
                        group=(form.get("Placement.GroupName") or [""])[0],
                        reservation=(
                            form.get("CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId")
                            or [""]
                        )[0],
                        market=(form.get("InstanceMarketOptions.MarketType") or [""])[0],
                    )
                    code = "InsufficientInstanceCapacity" if launch.subnet in proxy.blocked_subnets else None
                    code = code or (proxy.fault(launch) if proxy.fault is not None else None)
                    proxy.launches.append(dataclasses.replace(launch, error=code or ""))
                    if code:
                        proxy.refused.append(launch.subnet)
                        status = 500 if code.startswith("Insufficient") else 400
                        self._reply(status, _error_reply(code), [("Content-Type", "text/xml")])
                        return
                conn = http.client.HTTPConnection(up.hostname or "127.0.0.1", up.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                if launching and resp.status == 200:
                    proxy.extras.launched(form, data)
                    with proxy.lock:
                        proxy.made.append((time.monotonic(), dict(proxy.calls)))
                if launching and proxy.hold:
                    proxy.launched.set()
                    proxy.release.wait(120)
                with contextlib.suppress(OSError):  # the caller may be gone (killed while it waited)
                    self._reply(resp.status, data, resp.getheaders())

            do_GET = do_POST = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, name="fault-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@contextlib.contextmanager
def fault_proxy(moto: MotoEC2, blocked_subnets: Iterable[str] = ()) -> Iterator[FaultProxy]:
    """A ``FaultProxy`` in front of ``moto`` that corral's EC2 clients use (``AWS_ENDPOINT_URL``) while it
    lasts, RunInstances refused in ``blocked_subnets``; moto itself again afterwards."""
    fp = FaultProxy(moto.url).start()
    fp.blocked_subnets.update(blocked_subnets)
    os.environ["AWS_ENDPOINT_URL"] = fp.url
    try:
        yield fp
    finally:
        os.environ["AWS_ENDPOINT_URL"] = moto.url
        fp.stop()
