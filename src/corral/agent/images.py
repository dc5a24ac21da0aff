"""Images: references (name, tag, registry), pull failures in the user's terms, pull progress.

Pure helpers of :mod:`corral.agent.containers`; the engine's pull messages and errors come from
:mod:`corral.agent.docker`.
"""

from __future__ import annotations

from typing import Any

from .protocol_containers import ImagePullProgress


def split_image(ref: str) -> tuple[str, str]:
    """``name[:tag][@digest]`` -> (name, tag or digest); no tag means ``latest``."""
    if "@" in ref:
        name, digest = ref.split("@", 1)
        return name, digest
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = ref.rsplit(":", 1)
        return name, tag
    return ref, "latest"


def registry_of(name: str) -> str:
    first, sep, _ = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def pull_failure_message(ref: str, engine_message: str) -> str:
    """Tell "not found", "access denied" and "registry unreachable" apart, in the user's terms."""
    registry = registry_of(split_image(ref)[0])
    low = engine_message.lower()
    if any(s in low for s in ("not found", "manifest unknown", "repository does not exist", "no such image")):
        return f"Image `{ref}` was not found in its registry ({registry}): {engine_message}"
    if any(s in low for s in ("unauthorized", "no basic auth credentials", "authentication required", "denied")):
        return (
            f"The registry {registry} refused to serve image `{ref}`: {engine_message}. "
            "Check `registry_auth` (username and password or token)"
        )
    unreachable = (
        "dial tcp",
        "connection refused",
        "no such host",
        "i/o timeout",
        "network is unreachable",
        "tls handshake timeout",
        "server gave http response to https client",
        "cannot reach the docker engine",
    )
    if any(s in low for s in unreachable):
        return f"Cannot pull image `{ref}`: the registry {registry} is unreachable: {engine_message}"
    return f"Failed to pull image `{ref}`: {engine_message}"


class PullTracker:
    """Sums the engine's per-layer pull messages into dstack's ``ImagePullProgress``."""

    def __init__(self) -> None:
        self.layers: dict[str, dict[str, Any]] = {}

    def add(self, event: dict[str, Any]) -> bool:
        lid, status = event.get("id"), str(event.get("status") or "")
        if not lid or status.startswith(("Pulling from", "Digest:", "Status:")):
            return False
        layer = self.layers.setdefault(str(lid), {"total": None, "down": 0, "ext": 0, "cached": False})
        detail = event.get("progressDetail") or {}
        total = detail.get("total") if isinstance(detail.get("total"), int) else None
        current = detail.get("current") if isinstance(detail.get("current"), int) else 0
        if status == "Already exists":
            layer["cached"] = True
        elif status == "Downloading":
            layer["total"] = total or layer["total"]
            layer["down"] = current
        elif status in ("Verifying Checksum", "Download complete"):
            layer["down"] = layer["total"] or layer["down"]
        elif status == "Extracting":
            layer["total"] = layer["total"] or total
            layer["down"], layer["ext"] = layer["total"] or layer["down"], current
        elif status == "Pull complete":
            layer["down"] = layer["ext"] = layer["total"] or layer["down"]
        return True

    def snapshot(self) -> ImagePullProgress:
        live = [la for la in self.layers.values() if not la["cached"]]
        return ImagePullProgress(
            downloaded_bytes=sum(int(la["down"]) for la in live),
            extracted_bytes=sum(int(la["ext"]) for la in live),
            total_bytes=sum(int(la["total"] or 0) for la in live),
            is_total_bytes_final=bool(live) and all(la["total"] is not None for la in live),
        )
