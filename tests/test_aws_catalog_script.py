"""``scripts/aws_catalog.py`` as a process: from a SkyPilot ``vms.csv`` it keeps only the (type, region) pairs
the input has, prices spot at the cheapest availability zone (never a Local Zone's) and not at all where no
zone has a spot price, reports an L4 as 24 GB, leaves out Graviton and metal types, and says where each price
comes from; run on the shipped subset it writes the shipped catalogue byte for byte."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "aws_catalog.py"

#: SkyPilot's vms.csv columns (skypilot-org/skypilot-catalog catalogs/v8/aws/vms.csv); prices made up here.
L4 = "{'Gpus': [{'Name': 'L4', 'Manufacturer': 'NVIDIA', 'Count': 1, 'MemoryInfo': {'SizeInMiB': 22888}}]}"
H100 = "{'Gpus': [{'Name': 'H100', 'Manufacturer': 'NVIDIA', 'Count': 1, 'MemoryInfo': {'SizeInMiB': 81920}}]}"
HEADER = "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone"
VMS = f"""{HEADER},Arch
g6.xlarge,L4,1.0,4.0,16.0,"{L4}",0.8,0.40,us-east-1,use1-az1,x86_64
g6.xlarge,L4,1.0,4.0,16.0,"{L4}",0.8,0.35,us-east-1,use1-az2,x86_64
g6.xlarge,L4,1.0,4.0,16.0,"{L4}",0.8,,us-east-1,use1-az4,x86_64
g6.xlarge,L4,1.0,4.0,16.0,"{L4}",0.9,0.10,us-west-2,usw2-lax1-az1,x86_64
g6.xlarge,L4,1.0,4.0,16.0,"{L4}",0.8,0.50,us-west-2,usw2-az1,x86_64
p5.4xlarge,H100,1.0,16.0,256.0,"{H100}",6.9,,us-east-1,use1-az1,x86_64
p5.4xlarge,H100,1.0,16.0,256.0,"{H100}",6.9,,us-east-1,use1-az2,x86_64
m5.large,,,2.0,8.0,,0.1,0.04,eu-west-1,euw1-az1,x86_64
m5.metal,,,96.0,384.0,,4.6,1.5,eu-west-1,euw1-az1,x86_64
m7g.large,,,2.0,8.0,,0.08,0.03,eu-west-1,euw1-az1,arm64
m5.large,,,2.0,8.0,,0.1,0.04,ap-south-1,aps1-az1,x86_64
"""


def _run(*args: str) -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_rows_come_only_from_the_input_with_cheapest_zone_spot(tmp_path: Path) -> None:
    (tmp_path / "vms.csv").write_text(VMS)
    _run(str(tmp_path / "vms.csv"), str(tmp_path / "out.csv"))
    with (tmp_path / "out.csv").open(newline="") as f:
        rows = {(r["instance_name"], r["location"], r["spot"]): r for r in csv.DictReader(f)}
    assert sorted(rows) == [
        ("g6.xlarge", "us-east-1", "False"),
        ("g6.xlarge", "us-east-1", "True"),
        ("g6.xlarge", "us-west-2", "False"),
        ("g6.xlarge", "us-west-2", "True"),
        ("m5.large", "eu-west-1", "False"),
        ("m5.large", "eu-west-1", "True"),
        ("p5.4xlarge", "us-east-1", "False"),  # no zone has a spot price: no spot offer
    ]  # no metal, no arm64, no region outside the four, no pair the input lacks (g6 in eu-west-1)
    assert rows[("g6.xlarge", "us-east-1", "True")]["price"] == "0.35"  # the cheapest zone
    assert rows[("g6.xlarge", "us-west-2", "True")]["price"] == "0.5"  # a Local Zone's price is not the region's
    assert {r["gpu_memory"] for k, r in rows.items() if k[0] == "g6.xlarge"} == {"24"}  # L4: 24 GB, as gpuhunt
    assert rows[("p5.4xlarge", "us-east-1", "False")]["gpu_memory"] == "80"
    spot = json.loads(rows[("g6.xlarge", "us-east-1", "True")]["provider_data"])
    assert spot["source"] == "skypilot-org/skypilot-catalog catalogs/v8/aws/vms.csv" and spot["zone"] == "use1-az2"
    assert spot["commit"] and spot["date"]


def test_the_shipped_catalogue_is_what_the_script_makes_of_the_shipped_subset(tmp_path: Path) -> None:
    _run(str(ROOT / "scripts" / "data" / "aws_vms_v8_subset.csv"), str(tmp_path / "catalog.csv"))
    shipped = ROOT / "src" / "corral" / "backends" / "aws" / "catalog.csv"
    assert (tmp_path / "catalog.csv").read_bytes() == shipped.read_bytes()
