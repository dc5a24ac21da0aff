"""The Docker engine of a fake SSH host (``HostSpec(docker=True)`` in ``fakehosts``): how the host boots
with its own ``dockerd``, and removing the cgroups its containers leave in the machine's hierarchies.

How: ``ip netns exec`` remounts
/sys, so the cgroup v1 hierarchies are mounted again inside; the data root cannot be on the host's
overlay root, so a real directory is bind-mounted at /var/lib/docker; /run/docker and /run/containerd
start empty at each boot (the machine's own may hold a stale state). The host's root is then made the
overlay by ``pivot_root``, not ``chroot``: ``docker exec`` joins a container's mount namespace at that
namespace's root, which under a chroot is the machine's. dockerd listens on the default
/var/run/docker.sock, keeps its ``docker0`` inside the host's network namespace and writes no iptables
rules (published ports go through ``docker-proxy``).
"""

from __future__ import annotations

import contextlib
import pathlib

_MOUNT_FLAGS = ("rw", "ro", "relatime", "nosuid", "nodev", "noexec")


def cgroup_v1_mounts() -> list[tuple[str, str]]:
    """(mount point under /sys/fs/cgroup, options) of this machine's cgroup v1 hierarchies."""
    found = []
    for line in pathlib.Path("/proc/self/mounts").read_text().splitlines():
        _dev, point, fstype, opts, *_ = line.split()
        if fstype == "cgroup" and point.startswith("/sys/fs/cgroup/"):
            found.append((point, ",".join(o for o in opts.split(",") if o not in _MOUNT_FLAGS)))
    if not found:
        raise RuntimeError("a fake host with Docker needs the machine's cgroup v1 hierarchies under /sys/fs/cgroup")
    return found


def boot_script(root: pathlib.Path, data: pathlib.Path, cgroup_parent: str, insecure: str, sshd: str) -> str:
    """The rest of a fake host's boot script (run in its mount namespace, with the overlay mounted at
    ``root``): mounts, ``pivot_root``, dockerd in the background, then ``exec`` of ``sshd``."""
    m = root
    cgroups = "".join(
        f"mkdir -p {m}{point} && mount -t cgroup -o {opts} cgroup {m}{point} && " for point, opts in cgroup_v1_mounts()
    )
    dockerd = (
        "/usr/sbin/dockerd --iptables=false --ip-masq=false --ip-forward=false "
        f"--cgroup-parent {cgroup_parent} --insecure-registry {insecure}"
    )
    return (
        f"mount -t tmpfs cgroup {m}/sys/fs/cgroup && {cgroups}"
        f"mkdir -p {data} {m}/var/lib/docker && mount --bind {data} {m}/var/lib/docker && "
        f"for d in docker containerd; do mkdir -p {m}/run/$d && mount -t tmpfs tmpfs {m}/run/$d; done && "
        f"rm -f {m}/run/docker.pid {m}/run/docker.sock && "
        f"cd {m} && mkdir -p .oldroot && pivot_root . .oldroot && cd / && umount -l /.oldroot && rmdir /.oldroot && "
        f"{{ {dockerd} >> /var/log/dockerd.log 2>&1 < /dev/null & }} && "
        f"exec {sshd}"
    )


def _rmdir_tree(d: pathlib.Path) -> None:
    for sub in [*sorted(d.rglob("*"), key=lambda p: -len(p.parts)), d]:
        if sub.is_dir():
            with contextlib.suppress(OSError):
                sub.rmdir()


def remove_cgroups(prefix: str) -> None:
    """cgroups are not namespaced here: a host's dockerd leaves ``<controller>/<prefix>*/<id>`` dirs
    in the machine's v1 hierarchies (every one of them when it was killed)."""
    root = pathlib.Path("/sys/fs/cgroup")
    for ctrl in root.iterdir() if root.is_dir() else []:
        for d in ctrl.glob(f"{prefix}*"):
            if d.is_dir():
                _rmdir_tree(d)
