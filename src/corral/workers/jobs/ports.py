"""Ports a job on this machine would listen on that something else already holds (``ports_binding_failed``).

A job that runs as a host process on a local instance -- or in a container on the host's network -- shares
this machine's ports with everything else on it: before it starts, each of its ``ports`` is bound once
here to learn whether it is free. May import: the standard library only.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable


def taken_ports(ports: Iterable[int]) -> list[int]:
    """The ports in ``ports`` that cannot be bound on this machine (something listens there)."""
    taken = []
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                taken.append(port)
    return taken


def ports_message(taken: list[int]) -> str:
    names = ", ".join(str(p) for p in taken)
    return (
        f"Port{'s' if len(taken) > 1 else ''} {names} of the job's `ports` "
        f"{'are' if len(taken) > 1 else 'is'} already in use on this machine: stop what listens there, "
        "or run the job in a container (`image`)"
    )
