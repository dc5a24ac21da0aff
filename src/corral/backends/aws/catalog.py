"""The AWS catalogue: instance types, resources and prices per region, read from a gpuhunt v2 CSV.

Three catalogues can be in use, in this order (``CatalogSource``, ``backends.aws.live_catalog``):
``CORRAL_AWS_CATALOG`` (a file the operator names), gpuhunt's published AWS catalogue once a server has
fetched it into its state directory, and the snapshot shipped beside this module (``catalog.csv``,
written by ``scripts/aws_catalog.py`` from SkyPilot's published AWS catalogue; every row's
``provider_data`` names its source, commit and date). ``CatalogInfo`` says which one and how old it is.
An EC2 instance's resources are its type's row here. Offers are on-demand and spot (``resources.spot``);
a run's or fleet's ``spot_policy`` picks among them (``scheduler.offer_filters``).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from corral.domain.resources import Gpu, InstanceResources
from corral.scheduler.types import Offer

SHIPPED = Path(__file__).with_name("catalog.csv")
#: The root volume every instance gets (dstack's default disk: 100 GB).
DISK_GIB = 100
REQUIRED = ("instance_name", "location", "price", "cpu", "memory", "gpu_count", "spot")
#: AWS charges every public IPv4 address $0.005 an hour since 2024-02-01 (AWS News Blog, "New - AWS
#: Public IPv4 Address Charge + Public IP Insights", 2023-07-28); the catalogue's prices leave it out.
PUBLIC_IPV4_HOURLY = 0.005


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
    date: str = ""


@dataclass(frozen=True)
class CatalogInfo:
    """Which catalogue the prices come from (``source``) and the day they are from (``date``, ISO)."""

    source: str
    date: str

    @property
    def label(self) -> str:
        return f"{self.source}, {self.date}" if self.date else self.source


@dataclass(frozen=True)
class Catalog:
    rows: list[CatalogRow]
    info: CatalogInfo


def _provider_data(raw: dict[str, str]) -> dict[str, object]:
    text = raw.get("provider_data") or ""
    data = json.loads(text) if text else {}
    return data if isinstance(data, dict) else {}


def _row(path: Path, n: int, raw: dict[str, str]) -> CatalogRow:
    try:
        gpus = int(float(raw["gpu_count"] or 0))
        gpu_mib = int(float(raw.get("gpu_memory") or 0) * 1024)
        spot = raw["spot"].strip().lower() in ("true", "1")
        res = InstanceResources(
            cpus=int(float(raw["cpu"])),
            memory_mib=int(float(raw["memory"]) * 1024),
            gpus=tuple(
                Gpu(name=raw.get("gpu_name") or "", memory_mib=gpu_mib, vendor=raw.get("gpu_vendor") or "nvidia")
                for _ in range(gpus)
            ),
            spot=spot,
            disk_size_mib=DISK_GIB * 1024,
        )
        data = _provider_data(raw)
        source = str(data.get("source") or "")
        if source and data.get("commit"):
            source += f" @ {str(data['commit'])[:8]}"
        return CatalogRow(
            raw["instance_name"], raw["location"], float(raw["price"]), spot, res, source, str(data.get("date") or "")
        )
    except (ValueError, TypeError, AttributeError) as e:
        raise CatalogError(f"{path}: row {n}: {e} (see gpuhunt's v2 columns: {', '.join(REQUIRED)})") from None


def _usable(raw: dict[str, str]) -> bool:
    """Rows corral can launch: x86 (its images are amd64 only) and without gpuhunt flags (dstack skips
    flags it does not support; the AWS provider sets none)."""
    return (raw.get("cpu_arch") or "x86") == "x86" and not (raw.get("flags") or "").strip()


def load(path: Path | None = None) -> list[CatalogRow]:
    """Every usable row of the catalogue (``path``, else the shipped one)."""
    path = path or SHIPPED
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
            if missing:
                raise CatalogError(f"{path}: missing column(s) {', '.join(missing)} (gpuhunt's v2 CSV format)")
            rows = [_row(path, n, raw) for n, raw in enumerate(reader, start=2) if _usable(raw)]
    except OSError as e:
        raise CatalogError(f"{path}: cannot read the AWS catalogue ({e.strerror or e}); check CORRAL_AWS_CATALOG")
    if not rows:
        raise CatalogError(f"{path}: no usable row (x86, no flags) in the AWS catalogue")
    return rows


def describe(rows: list[CatalogRow], path: Path, fallback_source: str = "") -> CatalogInfo:
    """Where ``rows`` come from: the source their ``provider_data`` names (the newest date), else
    ``fallback_source`` (or the file's path) dated by the file's modification day."""
    dated = sorted({(r.date, r.source) for r in rows if r.source and r.date})
    if dated:
        date, source = dated[-1]
        return CatalogInfo(source, date)
    mtime = datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc).date().isoformat()
    return CatalogInfo(fallback_source or str(path), mtime)


def read(path: Path | None = None, fallback_source: str = "") -> Catalog:
    """The catalogue at ``path`` (else the shipped one) and where it comes from."""
    rows = load(path)
    return Catalog(rows, describe(rows, path or SHIPPED, fallback_source))


def offers(rows: list[CatalogRow], regions: frozenset[str] | None = None) -> list[Offer]:
    """The on-demand and spot offers of ``regions`` (None: all), cheapest first."""
    chosen = [r for r in rows if regions is None or r.region in regions]
    chosen.sort(key=lambda r: (r.price, r.instance_type, r.region, r.spot))
    return [Offer("aws", r.instance_type, r.region, r.price, r.resources) for r in chosen]
