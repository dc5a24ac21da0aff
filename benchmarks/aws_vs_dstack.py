#!/usr/bin/env python3
"""corral and dstack 0.22.5 launching the same AWS fleet against the same moto: EC2 API calls and time up
to the Nth RunInstances.

moto's EC2 server on loopback (its default VPC, the test AMI), a counting proxy in front of it
(``tests/aws/moto_harness.FaultProxy``, which counts every call by action), and each server in turn as a
process, with boto3's ``AWS_ENDPOINT_URL`` pointed at the proxy and the same ``type: aws`` block (one
region, the default VPC, public IPs; dstack's ``os_images.cpu`` names the test AMI, which dstack's own
image lookup would not find in moto). dstack's gpuhunt reads corral's shipped catalogue
(``GPUHUNT_CATALOG_URL=file://...``: no network). Each applies a fleet of ``nodes: N`` (default 20) and
the clock runs from the apply to the Nth RunInstances moto answered; the calls counted are those made
until then (STS, EC2 and service quotas). The default VPC gets an internet gateway route (dstack looks for public
subnets). Instances never become ready for either: no host answers at
moto's addresses, and dstack's UserData downloads its agent from S3. moto's state is reset in between.
For corral's time to ready (instances that answer, against fake hosts) see ``aws_provisioning.py``.

dstack runs from ``~/.cache/corral-bench/dstack-server-aws-0.22.5`` (``dstack[server,aws]``, installed
once). Figures, not assertions::

    .venv/bin/python benchmarks/aws_vs_dstack.py [--instances 20]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests"), str(ROOT / "tests" / "aws")]

from benchlib import servers  # noqa: E402

REGION = "us-east-1"
AMI_NAME = "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-*"
BLOCK = f"""
projects:
  - name: main
    backends:
      - type: aws
        creds: {{type: access_key, access_key: AKIABENCHMARK, secret_key: bench-secret}}
        regions: [{REGION}]
"""
# Canonical's account (terraform-provider-aws docs, r/instance: ``owners = ["099720109477"] # Canonical``)
DSTACK_IMAGES = f"""        os_images:
          cpu: {{name: "{AMI_NAME}", owner: "099720109477", user: ubuntu}}
"""


def gpuhunt_catalog(base: Path) -> str:
    """A file:// gpuhunt catalogue whose AWS provider is corral's shipped catalogue."""
    from corral.backends.aws.catalog import SHIPPED

    version = "2026-12-01"
    (base / "aws" / version).mkdir(parents=True)
    (base / "aws" / "version").write_text(version)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("aws.csv", SHIPPED.read_text())
    (base / "aws" / version / "catalog.zip").write_bytes(buf.getvalue())
    return f"file://{base}"


def measure(
    kind: str, root: Path, proxy: Any, moto_url: str, n: int, venv: Path | None, limit: float
) -> dict[str, Any]:
    httpx.post(f"{moto_url}/moto-api/reset")
    _internet_route(moto_url)
    proxy.calls.clear()
    proxy.made.clear()
    flavour = servers.Flavour(kind, root / kind, dstack_venv=venv)
    flavour.fresh()
    flavour.state.mkdir(parents=True, exist_ok=True)
    (flavour.state / "config.yml").write_text(BLOCK + (DSTACK_IMAGES if kind == "dstack" else ""))
    running = servers.start(flavour, timeout=300)
    try:
        boot_calls = sum(proxy.calls.values())  # the credentials check at start-up
        fleet = {"type": "fleet", "name": "bench", "nodes": n, "backends": ["aws"], "resources": {"cpu": "2.."}}
        body = {"plan": {"spec": {"configuration": fleet, "profile": {}}}, "force": True}
        headers = {"Authorization": f"Bearer {running.token}"}
        t0 = time.monotonic()
        r = httpx.post(f"{running.url}/api/project/main/fleets/apply", json=body, headers=headers, timeout=60)
        if r.status_code != 200:
            raise servers.BenchError(f"{kind}: fleets/apply answered {r.status_code}: {r.text[:500]}")
        deadline = t0 + limit
        while len(proxy.made) < n:
            if time.monotonic() > deadline:
                raise servers.BenchError(
                    f"{kind}: {len(proxy.made)} of {n} RunInstances in {limit:.0f} s; calls {proxy.calls}\n"
                    + "\n".join(_problems(running.log_path))
                )
            time.sleep(0.2)
        at, calls = proxy.made[n - 1]
        first = proxy.made[0][0] - t0
        httpx.post(f"{running.url}/api/project/main/fleets/delete", json={"names": ["bench"]}, headers=headers)
        return {"kind": kind, "startup_s": running.startup_s, "first_s": first, "nth_s": at - t0,
                "calls": calls, "boot_calls": boot_calls}  # fmt: skip
    finally:
        servers.stop(running)


def _internet_route(moto_url: str) -> None:
    """moto's default VPC has no route out; dstack wants public subnets (a route to an internet gateway)."""
    import boto3

    ec2 = boto3.client(
        "ec2", endpoint_url=moto_url, region_name=REGION, aws_access_key_id="a", aws_secret_access_key="b"
    )
    vpc = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    igw = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
    ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc)
    tables = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["RouteTables"]
    for t in tables:
        ec2.create_route(RouteTableId=t["RouteTableId"], DestinationCidrBlock="0.0.0.0/0", GatewayId=igw)


def _problems(log: Path) -> list[str]:
    """The server log's warnings and errors (the last 30)."""
    lines = log.read_text(errors="replace").splitlines()
    return [line[:300] for line in lines if "WARNING" in line or "ERROR" in line][-30:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=20)
    ap.add_argument("--only", choices=("corral", "dstack"), default=None)
    ap.add_argument("--limit", type=float, default=600.0, help="seconds each server gets for the launches")
    a = ap.parse_args()
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    from moto_harness import FaultProxy, MotoEC2

    venv = servers.ensure_dstack_venv(servers.DEFAULT_DSTACK_VENV.with_name("dstack-server-aws-0.22.5"), "server,aws")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        moto = MotoEC2(base).start()
        proxy = FaultProxy(moto.url).start()
        os.environ.update(
            AWS_ENDPOINT_URL=proxy.url,
            AWS_EC2_METADATA_DISABLED="true",
            GPUHUNT_CATALOG_URL=gpuhunt_catalog(base / "gpuhunt"),
            CORRAL_AWS_LIVE_CATALOG="off",  # corral prices from its shipped catalogue, the one dstack gets above
        )
        results = []
        try:
            for kind in ("corral", "dstack"):
                if a.only in (None, kind):
                    results.append(
                        measure(kind, base, proxy, moto.url, a.instances, venv if kind == "dstack" else None, a.limit)
                    )
        finally:
            proxy.stop()
            moto.stop()
    n = a.instances
    for r in results:
        calls: dict[str, int] = r["calls"]
        total = sum(calls.values()) - r["boot_calls"]
        print(
            f"{r['kind']}: start-up {r['startup_s']:.1f} s; first RunInstances {r['first_s']:.1f} s and the {n}th "
            f"{r['nth_s']:.1f} s after the apply; {total} AWS API calls until then ({total / n:.1f} per instance, "
            f"{r['boot_calls']} more at start-up)"
        )
        print("   ", ", ".join(f"{k} {v}" for k, v in sorted(calls.items(), key=lambda kv: -kv[1])))


if __name__ == "__main__":
    main()
