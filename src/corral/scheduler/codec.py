"""JSON forms of the scheduler's value types, as stored in an instance row's ``offer``."""

from __future__ import annotations

import dataclasses
from typing import Any

from corral.domain.resources import Gpu, InstanceResources
from corral.scheduler.types import Offer


def resources_to_json(res: InstanceResources) -> dict[str, Any]:
    return dataclasses.asdict(res)


def resources_from_json(data: dict[str, Any]) -> InstanceResources:
    fields = {f.name for f in dataclasses.fields(InstanceResources)}
    values = {k: v for k, v in data.items() if k in fields}
    values["gpus"] = tuple(Gpu(**g) for g in data.get("gpus", ()))
    return InstanceResources(**values)


def offer_to_json(offer: Offer) -> dict[str, Any]:
    return {
        "backend": offer.backend,
        "instance_type": offer.instance_type,
        "region": offer.region,
        "price": offer.price,
        "resources": resources_to_json(offer.resources),
        "host_blocks": offer.host_blocks,
        "host_total_blocks": offer.host_total_blocks,
        **({"zone": offer.zone} if offer.zone else {}),
        **({"gpu_jobs_only": True} if offer.gpu_jobs_only else {}),
    }


def offer_from_json(data: dict[str, Any]) -> Offer:
    return Offer(
        backend=data["backend"],
        instance_type=data["instance_type"],
        region=data["region"],
        price=float(data["price"]),
        resources=resources_from_json(data["resources"]),
        host_blocks=int(data.get("host_blocks") or 0),
        host_total_blocks=int(data.get("host_total_blocks") or 0),
        zone=str(data.get("zone") or ""),
        gpu_jobs_only=bool(data.get("gpu_jobs_only")),
    )
