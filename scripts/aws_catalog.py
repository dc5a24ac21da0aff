"""Write corral's shipped AWS catalogue (``src/corral/backends/aws/catalog.csv``, gpuhunt's v2 CSV format)
from a SkyPilot ``vms.csv`` (schema v7/v8: one row per instance type, region and availability zone).

The input is SkyPilot's published AWS catalogue, ``catalogs/v8/aws/vms.csv`` of
https://github.com/skypilot-org/skypilot-catalog, which SkyPilot's fetcher
(``sky/catalog/data_fetchers/fetch_aws.py``) builds from AWS's price list (on-demand, Linux, shared
tenancy), ``DescribeSpotPriceHistory`` (spot, per zone) and ``DescribeInstanceTypeOfferings`` (which
types each zone offers). ``scripts/data/aws_vms_v8_subset.csv`` holds the rows corral ships: for each
(type, region) below, the snapshot's row of its cheapest spot zone (or its first zone, when no zone has a
spot price); its ``GpuInfo`` keeps only the keys read here. See ``SNAPSHOT`` and ``docs/backends/aws.md``.

What the script keeps and how it derives each row, as gpuhunt does for dstack's catalogue
(``gpuhunt/providers/aws.py``):

- only the (type, region) pairs present in the input: no pair is invented;
- the families in ``FAMILIES``, x86 only, no ``metal`` sizes, no ``nano``/``micro``/``small``;
- the regions in ``REGIONS``; zones of Local Zones (``usw2-lax1-az1``) are not counted;
- on-demand price: the row's ``Price``; spot price: the cheapest zone's ``SpotPrice``, and no spot row
  where no zone has one (p5.4xlarge has no spot market);
- GPU memory from ``GpuInfo``, except L4: 24 GB, as gpuhunt forces it (``_get_gpu_memory_gib``), so a
  dstack-style ``L4:24GB`` request matches;
- ``provider_data`` says where the price came from and when (``source``, ``commit``, ``date``, ``zone``).

Run: ``.venv/bin/python scripts/aws_catalog.py [vms.csv [out.csv]]`` (default: the subset above, into the
shipped ``catalog.csv``).
"""

from __future__ import annotations

import ast
import csv
import json
import pathlib
import sys
from collections import defaultdict

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "src/corral/backends/aws/catalog.csv"
DEFAULT_INPUT = ROOT / "scripts/data/aws_vms_v8_subset.csv"
#: The snapshot the shipped rows come from. The file itself carries no date: ``date`` is the day it was
#: read; its contents (p5.4xlarge, m8a, the June 2025 P4/P5 price cut) place it in late 2025 or after.
SNAPSHOT = {
    "source": "skypilot-org/skypilot-catalog catalogs/v8/aws/vms.csv",
    "commit": "00148f2af3672e2229b4f7bf8157d5a3f36e3c35",
    "date": "2026-12-06",
}
REGIONS = ("us-east-1", "us-west-2", "eu-west-1", "eu-central-1")
FAMILIES = ("t3.", "m5.", "m7i.", "c5.", "c7i.", "g4dn.", "g5.", "g6.", "g6e.", "p4d.", "p5.")
SKIPPED_SIZES = (".nano", ".micro", ".small")
#: gpuhunt reports L4 as 24 GB whatever DescribeInstanceTypes says (22888 MiB); dstack's offers show 24.
FORCED_GPU_GIB = {"L4": 24.0}
COLUMNS = [
    "instance_name", "location", "price", "cpu", "memory", "gpu_count", "gpu_name", "gpu_memory",
    "spot", "disk_size", "gpu_vendor", "flags", "cpu_arch", "provider_data",
]  # fmt: skip


def _wanted(raw: dict[str, str]) -> bool:
    name = raw["InstanceType"]
    return (
        name.startswith(FAMILIES)
        and "metal" not in name
        and not name.endswith(SKIPPED_SIZES)
        and raw["Arch"] == "x86_64"
        and raw["Region"] in REGIONS
        and raw["AvailabilityZone"].count("-") == 1  # "use1-az1"; a Local Zone is "usw2-lax1-az1"
    )


def _gpu(raw: dict[str, str]) -> tuple[int, str, str, str]:
    """(count, name, memory GiB, vendor) of the row's accelerators; (0, "", "", "") without."""
    if not raw["AcceleratorName"]:
        return 0, "", "", ""
    gpus = ast.literal_eval(raw["GpuInfo"])["Gpus"]
    name = gpus[0]["Name"]
    gib = FORCED_GPU_GIB.get(name, gpus[0]["MemoryInfo"]["SizeInMiB"] / 1024)
    return sum(g["Count"] for g in gpus), name, f"{gib:g}", gpus[0]["Manufacturer"].lower()


def _rows(zones: list[dict[str, str]]) -> list[dict[str, str]]:
    """The on-demand row and, when a zone has a spot price, the spot row of one (type, region)."""
    first = zones[0]
    count, gpu_name, gpu_gib, vendor = _gpu(first)
    base = {
        "instance_name": first["InstanceType"],
        "location": first["Region"],
        "cpu": f"{float(first['vCPUs']):g}",
        "memory": f"{float(first['MemoryGiB']):g}",
        "gpu_count": str(count),
        "gpu_name": gpu_name,
        "gpu_memory": gpu_gib,
        "disk_size": "",
        "gpu_vendor": vendor,
        "flags": "",
        "cpu_arch": "x86",
    }
    meta = {**SNAPSHOT, "price": "AWS price list, on-demand, Linux"}
    out = [{**base, "price": f"{float(first['Price']):g}", "spot": "False", "provider_data": _json(meta)}]
    spots = [z for z in zones if z["SpotPrice"]]
    if spots:
        cheapest = min(spots, key=lambda z: float(z["SpotPrice"]))
        meta = {**SNAPSHOT, "price": "DescribeSpotPriceHistory, cheapest zone", "zone": cheapest["AvailabilityZone"]}
        out.append({**base, "price": f"{float(cheapest['SpotPrice']):g}", "spot": "True", "provider_data": _json(meta)})
    return out


def _json(value: dict[str, str]) -> str:
    return json.dumps(value, separators=(",", ":"))


def convert(source: pathlib.Path) -> list[dict[str, str]]:
    """gpuhunt v2 rows from a SkyPilot ``vms.csv``, sorted by type, region and market."""
    by_pair: dict[tuple[str, str], list[dict[str, str]]] = defaultdict(list)
    with source.open(newline="") as f:
        for raw in csv.DictReader(f):
            if _wanted(raw) and raw["Price"]:
                by_pair[(raw["InstanceType"], raw["Region"])].append(raw)
    return [row for pair in sorted(by_pair) for row in _rows(by_pair[pair])]


def main() -> None:
    source = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_INPUT
    out = pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else OUT
    rows = convert(source)
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    print(f"{out.name}: {len(rows)} rows from {source}")


if __name__ == "__main__":
    main()
