"""The AWS catalogue: instance types, resources and prices per region, read from a gpuhunt v2 CSV.

The shipped file (``catalog.csv`` beside this module, written by ``scripts/aws_catalog.py``) holds curated
on-demand prices (illustrative, dated in ``provider_data``) and rows generated from moto's instance-type
data by a documented price model; ``CORRAL_AWS_CATALOG`` names a newer file in the same format. An EC2
instance's resources are its type's row here. Offers are on-demand and spot (``resources.spot``); a run's or
fleet's ``spot_policy`` picks among them (``scheduler.offer_filters``).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from corral.domain.resources import Gpu, InstanceResources
from corral.scheduler.types import Offer

SHIPPED = Path(__file__).with_name("catalog.csv")
#: The root volume every instance gets (dstack's default disk: 100 GB).
DISK_GIB = 100
REQUIRED = ("instance_name", "location", "price", "cpu", "memory", "gpu_count", "spot")


class CatalogError(ValueError):
    """The catalogue file cannot be used; the message names the file, the row and the column."""


@dataclass(frozen=True)
class CatalogRow:
    instance_type: str
    region: str
    price: float
    spot: bool
    resources: InstanceResources
    source: str = ""


def _row(path: Path, n: int, raw: dict[str, str]) -> CatalogRow:
    try:
        gpus = int(raw["gpu_count"] or 0)
        gpu_mib = int(float(raw.get("gpu_memory") or 0) * 1024)
        spot = raw["spot"].strip().lower() in ("true", "1")
        res = InstanceResources(
            cpus=int(raw["cpu"]),
            memory_mib=int(float(raw["memory"]) * 1024),
            gpus=tuple(
                Gpu(name=raw.get("gpu_name") or "", memory_mib=gpu_mib, vendor=raw.get("gpu_vendor") or "nvidia")
                for _ in range(gpus)
            ),
            spot=spot,
            disk_size_mib=DISK_GIB * 1024,
        )
        source = json.loads(raw.get("provider_data") or "{}").get("source", "") if raw.get("provider_data") else ""
        return CatalogRow(raw["instance_name"], raw["location"], float(raw["price"]), spot, res, str(source))
    except (ValueError, TypeError, AttributeError) as e:
        raise CatalogError(f"{path}: row {n}: {e} (see gpuhunt's v2 columns: {', '.join(REQUIRED)})") from None


def load(path: Path | None = None) -> list[CatalogRow]:
    """Every row of the catalogue (``path``, else the shipped one)."""
    path = path or SHIPPED
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
            if missing:
                raise CatalogError(f"{path}: missing column(s) {', '.join(missing)} (gpuhunt's v2 CSV format)")
            return [_row(path, n, raw) for n, raw in enumerate(reader, start=2)]
    except OSError as e:
        raise CatalogError(f"{path}: cannot read the AWS catalogue ({e.strerror or e}); check CORRAL_AWS_CATALOG")


def offers(rows: list[CatalogRow], regions: frozenset[str] | None = None) -> list[Offer]:
    """The on-demand and spot offers of ``regions`` (None: all), cheapest first."""
    chosen = [r for r in rows if regions is None or r.region in regions]
    chosen.sort(key=lambda r: (r.price, r.instance_type, r.region))
    return [Offer("aws", r.instance_type, r.region, r.price, r.resources) for r in chosen]
