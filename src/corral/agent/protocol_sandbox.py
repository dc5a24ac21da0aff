"""The sandbox part of the agent's wire format (see :mod:`corral.agent.protocol`).

``JobState.sandbox`` says how a host-process job runs: in a sandbox (its address in corral's bridge
network, its uid, and for each of its ``ports`` the host port on the agent's loopback that reaches it) or
not (``message`` says why: the agent does not run as root, a tool is missing, it was turned off).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .fields import ProtocolError, _int, _obj, _str


@dataclass
class SandboxInfo:
    address: str | None = None
    uid: int | None = None
    #: the job's port -> the host port (on the agent's loopback) that reaches it
    ports: dict[int, int] = field(default_factory=dict)
    #: set when the job runs without a sandbox: why
    message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "uid": self.uid,
            "ports": {str(k): v for k, v in self.ports.items()},
            "message": self.message,
        }

    @classmethod
    def from_dict(cls, data: Any) -> SandboxInfo:
        w = "JobState.sandbox"
        d = _obj(data, w)
        ports = d.get("ports") or {}
        if not isinstance(ports, dict):
            raise ProtocolError(f"{w}.ports: expected an object of port numbers")
        out: dict[int, int] = {}
        for k, v in ports.items():
            if not str(k).isdigit() or isinstance(v, bool) or not isinstance(v, int) or not 0 < v < 65536:
                raise ProtocolError(f"{w}.ports: {k!r}: {v!r} is not a port mapping")
            out[int(k)] = v
        return cls(
            address=_str(d, "address", w, optional=True, nonempty=True),
            uid=_int(d, "uid", w, optional=True, minimum=0),
            ports=out,
            message=_str(d, "message", w, optional=True),
        )


@dataclass
class AddressReply:
    """``POST /jobs/{id}/address``: the address the job will have in its sandbox (reserved now, so that
    every node of a multi-node run learns every other's before any starts), or null without a sandbox."""

    address: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"address": self.address}

    @classmethod
    def from_dict(cls, data: Any) -> AddressReply:
        d = _obj(data, "AddressReply")
        return cls(address=_str(d, "address", "AddressReply", optional=True, nonempty=True))
