"""Write corral's shipped AWS catalogue (``src/corral/backends/aws/catalog.csv``, gpuhunt's v2 CSV format).

Two kinds of rows, both marked in ``provider_data``:

- ``curated``: on-demand prices hand-entered from AWS's public EC2 price pages (us-east-1, Linux, as of
  the date in ``CURATED_DATE``), illustrative only -- prices change; give a newer catalogue with
  ``CORRAL_AWS_CATALOG``. Other regions apply the region factor below.
- ``generated``: every other instance type of the families corral offers, with CPUs, memory, GPUs and disk
  from moto's instance-type data (``moto/ec2/resources/instance_types.json.gz``) and a synthetic price:
  ``0.0104 * vCPUs + 0.0052 * memory GiB + GPU rate * GPUs`` dollars an hour, times the region factor.
  Not real prices: they only order offers plausibly.

Spot rows are 35 % of the on-demand price. Run: ``.venv/bin/python scripts/aws_catalog.py`` (needs moto).
"""

from __future__ import annotations

import csv
import gzip
import json
import pathlib

import moto

CURATED_DATE = "2026-11-01"
OUT = pathlib.Path(__file__).resolve().parents[1] / "src/corral/backends/aws/catalog.csv"
REGIONS = {"us-east-1": 1.0, "us-west-2": 1.0, "eu-west-1": 1.12, "eu-central-1": 1.15}
FAMILIES = ("t3.", "m5.", "m7i.", "c5.", "c7i.", "r7i.", "g4dn.", "g5.", "g6.", "g6e.", "p4d.", "p5.")
GPU_RATES = {"T4": 0.35, "A10G": 0.75, "L4": 0.55, "L40S": 1.45, "A100": 3.9, "H100": 6.9}
#: us-east-1 on-demand $/hour, Linux (illustrative, copied by hand on CURATED_DATE).
CURATED = {
    "t3.medium": 0.0416,
    "t3.large": 0.0832,
    "t3.xlarge": 0.1664,
    "m5.large": 0.096,
    "m5.xlarge": 0.192,
    "m5.2xlarge": 0.384,
    "c5.xlarge": 0.17,
    "c5.2xlarge": 0.34,
    "g4dn.xlarge": 0.526,
    "g4dn.2xlarge": 0.752,
    "g5.xlarge": 1.006,
    "g5.2xlarge": 1.212,
    "g6.xlarge": 0.8048,
    "g6e.xlarge": 1.861,
    "p4d.24xlarge": 21.9576,
    "p5.48xlarge": 55.04,
}
COLUMNS = [
    "instance_name", "location", "price", "cpu", "memory", "gpu_count", "gpu_name", "gpu_memory",
    "spot", "disk_size", "gpu_vendor", "flags", "cpu_arch", "provider_data",
]  # fmt: skip


def main() -> None:
    path = pathlib.Path(moto.__file__).parent / "ec2/resources/instance_types.json.gz"
    types = json.loads(gzip.decompress(path.read_bytes()))
    rows = []
    for name in sorted(types):
        if not name.startswith(FAMILIES) or name.endswith(("metal", ".nano", ".micro", ".small")):
            continue
        t = types[name]
        arch = "arm" if "arm64" in t["ProcessorInfo"]["SupportedArchitectures"] else "x86"
        cpus, mem_gib = t["VCpuInfo"]["DefaultVCpus"], t["MemoryInfo"]["SizeInMiB"] / 1024
        gpus = (t.get("GpuInfo") or {}).get("Gpus") or []
        gpu = gpus[0] if gpus else None
        gpu_count = sum(g["Count"] for g in gpus)
        curated = name in CURATED
        base = CURATED.get(name) or (
            0.0104 * cpus + 0.0052 * mem_gib + (GPU_RATES.get(gpu["Name"], 1.0) * gpu_count if gpu else 0.0)
        )
        for region, factor in REGIONS.items():
            for spot in (False, True):
                price = base * factor * (0.35 if spot else 1.0)
                rows.append(
                    {
                        "instance_name": name,
                        "location": region,
                        "price": f"{price:.4f}",
                        "cpu": cpus,
                        "memory": f"{mem_gib:g}",
                        "gpu_count": gpu_count,
                        "gpu_name": gpu["Name"] if gpu else "",
                        "gpu_memory": f"{gpu['MemoryInfo']['SizeInMiB'] / 1024:g}" if gpu else "",
                        "spot": str(spot),
                        "disk_size": "",
                        "gpu_vendor": gpu["Manufacturer"].lower() if gpu else "",
                        "flags": "",
                        "cpu_arch": arch,
                        "provider_data": json.dumps(
                            {"source": f"curated {CURATED_DATE}" if curated else "generated"}, separators=(",", ":")
                        ),
                    }
                )
    with OUT.open("w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print(f"{OUT.name}: {len(rows)} rows")


if __name__ == "__main__":
    main()
