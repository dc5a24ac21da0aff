"""Network volumes on the host: an EBS volume the server attached (its id and the device name it asked
for) found as a block device, given a filesystem when it has none (a new volume), mounted at
``/mnt/corral-volumes/<name>`` and, for a host-process job, bound at the job's path; unmounted when the
job ends (so that the server may detach it).

The device: a Nitro instance's udev link ``/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol<hex>``,
else the name asked for (``/dev/sdf``) or its Xen name (``/dev/xvdf``); waited for a while, as the
device appears some time after AttachVolume answered. Standard library only (Python 3.9+).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from .fields import ProtocolError, _obj, _str

MOUNT_ROOT = "/mnt/corral-volumes"
BY_ID = "/dev/disk/by-id"
DEVICE_WAIT_S = 60.0


@dataclass
class NetworkMount:
    """A network volume of the job: its name, the cloud's id, the device name it was attached as, the
    job's path."""

    name: str
    volume_id: str
    device_name: str
    path: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "volume_id": self.volume_id, "device_name": self.device_name, "path": self.path}

    @classmethod
    def from_dict(cls, data: Any) -> NetworkMount:
        w = "JobSubmission.network_volumes[]"
        d = _obj(data, w)
        m = cls(*(_str(d, k, w, nonempty=True) for k in ("name", "volume_id", "device_name", "path")))
        if not m.path.startswith("/") or "/" in m.name or m.name in (".", ".."):
            raise ProtocolError(f"{w}: path must be absolute and name a plain name, got {m.name!r} {m.path!r}")
        return m


class VolumeError(Exception):
    pass


def candidates(m: NetworkMount) -> list[str]:
    """Where the volume's block device may be, most specific first."""
    nvme = os.path.join(BY_ID, "nvme-Amazon_Elastic_Block_Store_" + m.volume_id.replace("-", ""))
    xen = m.device_name.replace("/dev/sd", "/dev/xvd", 1)
    return [nvme, m.device_name, xen]


def find_device(m: NetworkMount, wait: float = DEVICE_WAIT_S) -> str:
    deadline = time.monotonic() + wait
    while True:
        for path in candidates(m):
            if os.path.exists(path):
                return os.path.realpath(path)
        if time.monotonic() >= deadline:
            raise VolumeError(f"volume {m.name} ({m.volume_id}): no block device at {', '.join(candidates(m))}")
        time.sleep(0.5)


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def has_filesystem(device: str) -> bool:
    done = _run(["blkid", "-o", "value", "-s", "TYPE", device])
    return done.returncode == 0 and bool(done.stdout.strip())


def mount_point(m: NetworkMount) -> str:
    return os.path.join(MOUNT_ROOT, m.name)


def mount(m: NetworkMount) -> str:
    """Mount the volume (formatting it first when it has no filesystem): its mount point on the host."""
    device = find_device(m)
    if not has_filesystem(device):
        done = _run(["mkfs.ext4", "-q", "-F", device])
        if done.returncode != 0:
            raise VolumeError(f"volume {m.name}: mkfs.ext4 {device}: {done.stderr.strip()}")
    point = mount_point(m)
    os.makedirs(point, exist_ok=True)
    if not os.path.ismount(point):
        done = _run(["mount", device, point])
        if done.returncode != 0:
            raise VolumeError(f"volume {m.name}: mount {device} {point}: {done.stderr.strip()}")
    return point


def bind(source: str, path: str) -> None:
    os.makedirs(path, exist_ok=True)
    done = _run(["mount", "--bind", source, path])
    if done.returncode != 0:
        raise VolumeError(f"mount --bind {source} {path}: {done.stderr.strip()}")


def unmount(points: list[str]) -> list[str]:
    """Unmount ``points`` (binds first: pass them in the order they were mounted); what could not be."""
    failed = []
    for point in reversed(points):
        busy = os.path.ismount(point) and _run(["umount", point]).returncode != 0
        if busy and _run(["umount", "-l", point]).returncode != 0:
            failed.append(point)
    return failed
