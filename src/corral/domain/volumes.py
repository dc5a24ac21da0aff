"""Network volumes as values: the record of one, dstack's statuses, the device names EC2 attaches them as,
and the pure decisions about them (what the volumes worker does next, whether one may be deleted, where a
job using some may run). Pure: no SQL, HTTP, asyncio or clocks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: dstack's ``VolumeStatus`` (``deleted`` is corral's row flag, not a status on the wire).
SUBMITTED, PROVISIONING, ACTIVE, FAILED = "submitted", "provisioning", "active", "failed"
#: The device names AttachVolume tries, in order (dstack's ``/dev/sdf`` ... ``/dev/sdn``).
DEVICE_NAMES = tuple(f"/dev/sd{c}" for c in "fghijklmn")


@dataclass(frozen=True)
class VolumeRec:
    id: str
    project_id: str
    project_name: str
    user_name: str
    name: str
    status: str
    status_message: str | None
    #: dstack's volume configuration, as JSON.
    configuration: dict[str, Any]
    #: dstack's ``VolumeProvisioningData`` (None until the cloud made or found it).
    provisioning: dict[str, Any] | None
    #: The corral instance it is attached to, and how (``device_name``, ``job_id``).
    instance_id: str | None
    attachment: dict[str, Any] | None
    to_be_deleted: bool
    deleted: bool
    created_at: float
    deleted_at: float | None
    last_processed_at: float

    @property
    def external(self) -> bool:
        return bool(self.configuration.get("volume_id"))

    @property
    def volume_id(self) -> str | None:
        return str(self.provisioning["volume_id"]) if self.provisioning else None

    @property
    def region(self) -> str:
        return str(self.configuration.get("region") or "")

    @property
    def zone(self) -> str | None:
        z = (self.provisioning or {}).get("availability_zone")
        return str(z) if z else None


def mount_points(conf: Mapping[str, Any]) -> list[tuple[tuple[str, ...], str]]:
    """A run configuration's (as JSON) network volumes: (names, path) of each ``name:/path`` or ``{name,
    path}`` entry, ``names`` the alternatives of a list (``name: [a, b]``: the job mounts the one its
    instance can, as dstack does); instance volumes (``/host/path:/path``) are left out."""
    out: list[tuple[tuple[str, ...], str]] = []
    for v in conf.get("volumes") or []:
        if isinstance(v, str):
            src, _, path = v.partition(":")
            if "/" not in src:
                out.append(((src,), path))
        elif isinstance(v, Mapping) and v.get("name") is not None and not v.get("instance_path"):
            name = v["name"]
            names = tuple(str(n) for n in name) if isinstance(name, list) else (str(name),)
            out.append((names, str(v.get("path") or "")))
    return out


def volume_names(conf: Mapping[str, Any]) -> list[str]:
    """Every network volume a run names, each alternative of each mount point, in order."""
    return [n for names, _p in mount_points(conf) for n in names]


#: Where a volume is, so where an instance that mounts it must be: (backend, region, zone).
Place = tuple[str, str, str | None]


def place(v: VolumeRec) -> Place:
    return (str(v.configuration.get("backend") or ""), v.region.lower(), v.zone)


def where_volumes(volumes: Iterable[VolumeRec]) -> str:
    """``volumes`` named with where each is: ``data (us-east-1 us-east-1b), ...``."""
    return ", ".join(f"{v.name} ({v.region} {v.zone or '?'})" for v in volumes)


def placements(points: Sequence[Sequence[VolumeRec]]) -> frozenset[Place]:
    """Where a job whose mount points have the alternatives ``points`` may run: the places where each mount
    point has an alternative (EBS attaches only in its own zone). Raises ``ValueError`` naming the volumes
    and where they are when there is none, or when one volume is named at two mount points."""
    names = [v.name for alts in points for v in {v.name: v for v in alts}.values()]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"volume {', '.join(twice)} is named at more than one mount point")
    common: frozenset[Place] | None = None
    for alts in points:
        here = frozenset(place(v) for v in alts)
        common = here if common is None else common & here
    if not common:
        where = "; ".join(where_volumes(alts).replace(", ", " or ") for alts in points)
        raise ValueError(f"no availability zone has a volume of every mount point: {where}")
    return common


def chosen(points: Sequence[Sequence[VolumeRec]], where: Place) -> list[VolumeRec]:
    """The volume each mount point mounts on an instance at ``where`` (backend, region, zone): its first
    alternative there (dstack's rule). Raises ``ValueError`` naming the mount point's volumes when none is."""
    out = []
    for alts in points:
        v = next((v for v in alts if _mountable(place(v), where)), None)
        if v is None:
            raise ValueError(
                f"none of the volumes {where_volumes(alts)} can be mounted in {where[1]} {where[2] or ''}".strip()
            )
        out.append(v)
    return out


def _mountable(p: Place, where: Place) -> bool:
    backend, region, zone = where
    return p[0] == backend and p[1] == region.lower() and (p[2] is None or zone is None or p[2] == zone)


def next_step(v: VolumeRec) -> str | None:
    """What the volumes worker does with ``v``: ``delete`` (asked, and not attached), ``register`` (an
    existing volume, ``volume_id``), ``create``, or nothing."""
    if v.deleted:
        return None
    if v.to_be_deleted:
        return "delete" if v.instance_id is None else None
    if v.status == SUBMITTED:
        return "register" if v.external else "create"
    return None


def refuse_delete(volumes: Iterable[VolumeRec]) -> str | None:
    """Why the deletion of ``volumes`` is refused (dstack's message naming the one in use), or None."""
    for v in volumes:
        if v.instance_id is not None:
            return f"Failed to delete volume {v.name}. Volume is in use."
    return None


def free_device(taken: Iterable[str]) -> str | None:
    """The first of :data:`DEVICE_NAMES` that ``taken`` (the instance's attached devices) leaves free."""
    used = set(taken)
    return next((d for d in DEVICE_NAMES if d not in used), None)


def price(size_gib: int, iops: int = 3000) -> float:
    """A gp3 volume's monthly price in dollars (dstack's: $0.08 a GiB, $0.005 an IOPS over 3000)."""
    return size_gib * 0.08 + max(iops - 3000, 0) * 0.005
