"""A stream to a service replica's port on its host: through the instance's backend (the local machine's
loopback, or a channel of the SSH connection to a host). The proxy and the probes both reach replicas so."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from corral.backends.base import Compute, PortOpener
from corral.domain.records import InstanceRec


async def open_replica(
    computes: Mapping[str, Compute], instance: InstanceRec, host_port: int, timeout: float
) -> tuple[Any, Any]:
    """``(reader, writer)`` to ``host_port`` on the instance's host; raises ``OSError`` (nothing listens,
    the host is unreachable) or ``TimeoutError``."""
    compute = computes.get(instance.backend)
    if not isinstance(compute, PortOpener):
        raise ConnectionRefusedError(f"backend {instance.backend} cannot reach a replica's port")
    reader, writer = await asyncio.wait_for(compute.open_port(instance, host_port), timeout)
    return reader, writer
