"""The wire format of sessions into a running job (SSH sessions and forwarded connections, which the
server's SSH endpoint relays; see :mod:`corral.agent.sessions`).

``POST /jobs/{id}/exec`` and ``POST /jobs/{id}/connect`` carry a JSON body and the header
``Upgrade: corral-session``; the agent answers ``101 Switching Protocols`` (or a JSON error as any other
request), and the connection then carries

* for ``connect``: the raw bytes of a TCP connection to the job's port;
* for ``exec``: frames of ``kind`` (one byte) + payload length (4 bytes, big-endian) + payload. The server
  sends ``i`` (standard input), ``e`` (end of standard input), ``w`` (window size, JSON ``{"cols",
  "rows"}``) and ``s`` (a signal's name, e.g. ``INT``); the agent sends ``o`` (standard output), ``r``
  (standard error) and, last, ``x`` (JSON ``{"status": int | null, "signal": str | null}``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from .fields import ProtocolError

UPGRADE = "corral-session"
HEADER = struct.Struct(">cI")
MAX_FRAME = 1 << 20

STDIN, STDIN_EOF, WINDOW, SIGNAL = b"i", b"e", b"w", b"s"
STDOUT, STDERR, EXIT = b"o", b"r", b"x"


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


@dataclass
class ExecRequest:
    """A session's command (None: a login shell), its pty (``term``, ``cols``, ``rows``; None: pipes),
    ``subsystem`` (``sftp``: the host's sftp-server) and the client's environment (``LANG``, ``LC_*``)."""

    command: str | None = None
    term: str | None = None
    cols: int = 80
    rows: int = 24
    pty: bool = False
    subsystem: str | None = None
    env: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "pty": self.pty,
            "term": self.term,
            "cols": self.cols,
            "rows": self.rows,
            "subsystem": self.subsystem,
            "env": dict(self.env or {}),
        }

    @classmethod
    def from_dict(cls, d: Any) -> ExecRequest:
        if not isinstance(d, dict):
            raise ProtocolError("exec: expected a JSON object")
        req = cls()
        for name in ("command", "term", "subsystem"):
            v = d.get(name)
            if v is not None and not isinstance(v, str):
                raise ProtocolError(f"exec.{name}: expected a string")
            setattr(req, name, v)
        for name in ("cols", "rows"):
            v = d.get(name, getattr(req, name))
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 65536:
                raise ProtocolError(f"exec.{name}: expected an integer 0..65535")
            setattr(req, name, v)
        req.pty = bool(d.get("pty"))
        env = d.get("env") or {}
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ProtocolError("exec.env: expected an object of strings")
        req.env = env
        if req.subsystem not in (None, "sftp"):
            raise ProtocolError(f"exec.subsystem: {req.subsystem!r} is not known (only sftp)")
        return req


def parse_connect(d: Any) -> int:
    if not isinstance(d, dict) or not isinstance(d.get("port"), int) or not 0 < d["port"] < 65536:
        raise ProtocolError("connect.port: expected a port number 1..65535")
    return int(d["port"])
