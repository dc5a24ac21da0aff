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


def network_mounts(conf: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A run configuration's (as JSON) network volumes: (name, path) of each ``name:/path`` or ``{name,
    path}`` entry (instance volumes, ``/host/path:/path``, left out). A list of names mounts the first."""
    out = []
    for v in conf.get("volumes") or []:
        if isinstance(v, str):
            src, _, path = v.partition(":")
            if "/" not in src:
                out.append((src, path))
        elif isinstance(v, Mapping) and v.get("name") is not None and not v.get("instance_path"):
            name = v["name"]
            out.append((str(name[0] if isinstance(name, list) else name), str(v.get("path") or "")))
    return out


def volume_names(conf: Mapping[str, Any]) -> list[str]:
    return [n for n, _p in network_mounts(conf)]


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


def placement(volumes: Sequence[VolumeRec]) -> tuple[str, str, str | None]:
    """Where a job that mounts ``volumes`` must run: (backend, region, zone). Raises ``ValueError`` naming
    the volumes when they are not all in one place (EBS attaches only in its own zone)."""
    places = {(str(v.configuration.get("backend") or ""), v.region, v.zone) for v in volumes}
    if len(places) != 1:
        where = ", ".join(f"{v.name} ({v.region} {v.zone or '?'})" for v in volumes)
        raise ValueError(f"the volumes are not in one availability zone: {where}")
    return next(iter(places))


def price(size_gib: int, iops: int = 3000) -> float:
    """A gp3 volume's monthly price in dollars (dstack's: $0.08 a GiB, $0.005 an IOPS over 3000)."""
    return size_gib * 0.08 + max(iops - 3000, 0) * 0.005
