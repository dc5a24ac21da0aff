"""What a fleet asks of the aws backend's launches, checked when the fleet is planned or applied:
``availability_zones`` (zone names in the fleet's and the backend's regions) and ``tags`` (with the backend's,
within AWS's limits: ``domain.aws_tags``). The backend applies them (``backends.aws``, through
``cloud_backends.fleet_loader``).

May import: domain, services.errors. Light: no boto3, no backend code (fleet plans import it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from corral.domain import aws_tags
from corral.services.errors import ServiceError

#: An availability zone's name: its region's and a letter (``us-east-1a``). Local and Wavelength Zones
#: (``us-east-1-atl-2a``) are not launched in (EC2 API reference, AvailabilityZone ``zoneName``, ``zoneType``).
_ZONE = re.compile(r"^([a-z]{2}(?:-gov)?-[a-z]+-\d)[a-z]$")


def zone_region(zone: str) -> str | None:
    """The region of an availability zone's name (None: not one)."""
    m = _ZONE.match(zone)
    return m.group(1) if m else None


def check(
    backends: Sequence[Mapping[str, Any]],
    regions: Sequence[str] | None,
    zones: Sequence[str] | None,
    tags: Mapping[str, str] | None,
) -> None:
    """A fleet's ``availability_zones`` and ``tags`` as the project's aws backend will apply them: zone names
    in the fleet's (else the backend's) regions, tags (with the backend's) within AWS's limits; else a
    ``ServiceError`` naming the field. Nothing to check without an aws backend."""
    doc = next((b for b in backends if b.get("type") == "aws"), None)
    if doc is None:
        return
    allowed = [r.lower() for r in regions or []] or [str(r) for r in doc.get("regions") or []]
    for zone in zones or []:
        region = zone_region(zone)
        if region is None:
            raise ServiceError(f"availability_zones: {zone!r} is not an availability zone name (e.g. us-east-1a)")
        if allowed and region not in allowed:
            raise ServiceError(
                f"availability_zones: {zone} is in {region}, not among the fleet's regions ({', '.join(allowed)}): "
                "add the region or remove the zone"
            )
    field = "tags (the fleet's with the aws backend's)" if doc.get("tags") else "tags"
    why = aws_tags.problem(aws_tags.joined(doc.get("tags"), tags), field)
    if why is not None:
        raise ServiceError(why)
