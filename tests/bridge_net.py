"""A private /24 on this machine for a test harness: a Linux bridge ``<tag><N>br`` (``<prefix>.N.1/24`` on it)
and network namespaces ``<tag><N>h...`` plugged into it, each with an address of the /24.

Creating the bridge is the atomic claim of net N (another session on the same machine fails to create it and
takes the next); the claimer's pid is recorded under ``owners``, so that the next start removes the nets of a run
that died without cleaning up (:func:`stale_nets`). Used by the fake SSH hosts (``fakehosts``: ``cfh``,
10.213.N.0/24) and the ACME lab (``pebble_harness``: ``cpb``, 10.77.N.0/24). Needs root and iproute2.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still exists (a zombie does, until reaped)."""
    return pid > 0 and pathlib.Path(f"/proc/{pid}").exists()


def claim(tag: str, prefix: str, owners: pathlib.Path, nets: range, what: str) -> int:
    """The first N of ``nets`` whose ``<prefix>.N.0/24`` is routed nowhere here and whose bridge this call made,
    with this process recorded as its owner; its bridge is up at ``<prefix>.N.1``."""
    owners.mkdir(parents=True, exist_ok=True)
    routes = sh("ip", "-4", "route", "show", check=False).stdout.splitlines()
    for n in nets:
        if any(line.startswith(f"{prefix}.{n}.") for line in routes):
            continue
        if sh("ip", "link", "add", f"{tag}{n}br", "type", "bridge", check=False).returncode != 0:
            continue  # another run holds it
        (owners / str(n)).write_text(str(os.getpid()))
        try:
            sh("ip", "addr", "add", f"{prefix}.{n}.1/24", "dev", f"{tag}{n}br")
            sh("ip", "link", "set", f"{tag}{n}br", "up")
        except BaseException:
            sh("ip", "link", "del", f"{tag}{n}br", check=False)
            (owners / str(n)).unlink(missing_ok=True)
            raise
        return n
    raise RuntimeError(f"no free {prefix}.N.0/24 for {what}")


def stale_nets(tag: str, owners: pathlib.Path) -> list[int]:
    """The nets of ``tag`` whose owner (recorded under ``owners``) is gone."""
    stale = []
    for line in sh("ip", "-o", "link", "show", "type", "bridge", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if not (name.startswith(tag) and name.endswith("br") and name[len(tag) : -2].isdigit()):
            continue
        n = int(name[len(tag) : -2])
        try:
            owner = int((owners / str(n)).read_text())
        except (OSError, ValueError):
            owner = -1
        if owner <= 0 or not pid_alive(owner):
            stale.append(n)
    return stale


def remove(tag: str, n: int) -> None:
    """Net ``n``'s namespaces (their processes killed first) and its bridge."""
    prefix = f"{tag}{n}h"
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        if ns.startswith(prefix):
            for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            sh("ip", "netns", "del", ns, check=False)
    sh("ip", "link", "del", f"{tag}{n}br", check=False)


def plug(ns: str, veth: str, bridge: str, ip: str) -> None:
    """A new namespace ``ns`` whose ``eth0`` (``ip``/24, up, with ``lo``) is the peer of ``veth`` on ``bridge``."""
    sh("ip", "netns", "add", ns)
    sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
    sh("ip", "link", "set", veth, "master", bridge, "up")
    sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
    sh("ip", "-n", ns, "link", "set", "eth0", "up")
    sh("ip", "-n", ns, "link", "set", "lo", "up")
