"""Builders of dstack wire objects shared by the API's serialisers and the workers.

An instance row's ``offer`` (``scheduler.codec.offer_to_json``) becomes dstack's ``InstanceType``.
"""

from __future__ import annotations

from typing import Any


def instance_type(offer: dict[str, Any] | None) -> dict[str, Any] | None:
    """dstack's ``InstanceType`` (``{name, resources}``) from a stored offer."""
    if not offer:
        return None
    res = offer.get("resources") or {}
    return {
        "name": offer.get("instance_type", "local"),
        "resources": {
            "cpus": res.get("cpus", 0),
            "memory_mib": res.get("memory_mib", 0),
            "gpus": [
                {"name": g["name"], "memory_mib": g["memory_mib"], "vendor": g.get("vendor")}
                for g in res.get("gpus") or []
            ],
            "spot": bool(res.get("spot", False)),
            "disk": {"size_mib": res.get("disk_size_mib", 0)},
            "cpu_arch": res.get("cpu_arch"),
            "description": "",
        },
    }
