"""Rules over a fleet's normalised spec (the JSON that ``fleets/apply`` stores)."""

from __future__ import annotations

import datetime
from typing import Any

from corral.domain.ssh_keys import without_keys


def nodes_bounds(spec: dict[str, Any]) -> tuple[int, int | None]:
    """``(nodes.min, nodes.max)`` of a fleet spec; SSH fleets have exactly one node per host."""
    conf = spec.get("configuration") or {}
    ssh = conf.get("ssh_config")
    if ssh:
        n = len(ssh.get("hosts") or [])
        return n, n
    nodes = conf.get("nodes")
    if nodes is None:
        return 0, 0
    if isinstance(nodes, int):
        return nodes, nodes
    lo = nodes.get("min")
    hi = nodes.get("max")
    return int(lo or 0), (None if hi is None else int(hi))


def fleet_blocks(spec: dict[str, Any]) -> int | None:
    """The fleet's ``blocks`` (None = ``auto``)."""
    blocks = (spec.get("configuration") or {}).get("blocks", 1)
    if blocks == "auto":
        return None
    return int(blocks or 1)


def fleet_placement(spec: dict[str, Any]) -> str:
    return str((spec.get("configuration") or {}).get("placement") or "any")


def without_ssh_keys(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as clients see it: an SSH fleet's private keys (every ``ssh_key``: of ``ssh_config``, of
    each host, and of their proxy jumps) removed. dstack removes the first two; a proxy jump's key is
    as secret."""
    return without_keys(spec)


def stuck_message(tries: int, limit: int, since: float, error: str) -> str | None:
    """What an instance whose termination failed ``tries`` times (the first at ``since``) is reported with,
    once: when ``tries`` reaches ``limit``. None otherwise (not yet, or already reported)."""
    if tries != limit:
        return None
    started = datetime.datetime.fromtimestamp(since, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (
        f"Termination not confirmed after {tries} tries (since {started}): {error}. The instance counts against "
        "its fleet's nodes.max until the cloud confirms it is terminated; corral keeps trying"
    )
