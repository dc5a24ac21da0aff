"""Attaching to a running job over corral's SSH endpoint with asyncssh (no ``ssh`` subprocess, no retry
loop around one): the two hops of dstack's ``dockerized`` layout (``job_provisioning_data``'s host, port
and user, then ``localhost:10022`` through it as the job's user), local forwards of the run's ports, and
the job's output read from its ``/logs_ws`` websocket (``localhost:10999`` in the job).

Local forwards listen with ``SO_REUSEADDR`` (asyncio's servers do on Unix), so attaching again right
after a detach works even while a forwarded connection sits in ``TIME_WAIT``.
"""

from __future__ import annotations

import asyncio
import base64
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

RUNNER_HTTP_PORT = 10999
CONTAINER_SSH_PORT = 10022


class AttachError(Exception):
    pass


class Attachment:
    """The SSH connections to one job, and the forwards held on them."""

    def __init__(self) -> None:
        self.outer: Any = None
        self.inner: Any = None
        self.listeners: list[Any] = []

    async def open(self, jpd: dict[str, Any], jrd: dict[str, Any] | None, identity: Path, timeout: float = 15) -> None:
        import asyncssh

        try:
            key = asyncssh.read_private_key(str(identity))
        except (OSError, asyncssh.KeyImportError) as e:
            raise AttachError(f"cannot read the SSH key {identity}: {e}") from e
        opts: dict[str, Any] = {
            "client_keys": [key],
            "known_hosts": None,  # as the CLI's entries: StrictHostKeyChecking no
            "config": [],
            "agent_path": None,
            "connect_timeout": timeout,
        }
        ports = (jrd or {}).get("ports") or {}
        try:
            self.outer = await asyncssh.connect(
                jpd["hostname"], int(jpd["ssh_port"]), username=str(jpd["username"]), **opts
            )
            self.inner = await asyncssh.connect(
                "localhost",
                int(ports.get("10022", CONTAINER_SSH_PORT)),
                tunnel=self.outer,
                username=str((jrd or {}).get("username") or "root"),
                **opts,
            )
        except asyncssh.PermissionDenied as e:
            await self.close()
            raise AttachError(f"the SSH endpoint refused the key {identity} ({e.reason})") from e
        except (OSError, asyncssh.Error, asyncio.TimeoutError) as e:
            await self.close()
            raise AttachError(f"cannot connect to {jpd['hostname']}:{jpd['ssh_port']}: {e}") from e

    async def forward(self, bind: str, local: int, remote: int, automatic: bool) -> int:
        """Listen on ``bind:local`` (the next free port up from it when ``automatic``) and forward each
        connection to the job's ``remote`` port; the local port."""
        import asyncssh

        for port in range(local, min(local + 100, 65536)) if automatic else (local,):
            try:
                listener = await self.inner.forward_local_port(bind, port, "localhost", remote)
            except OSError:
                continue
            except asyncssh.Error as e:
                raise AttachError(f"cannot forward port {remote}: {e}") from e
            self.listeners.append(listener)
            return int(listener.get_port())
        raise AttachError(
            f"port {local} is already in use; use -p to map another local port, e.g. -p {local + 1}:{remote}"
        )

    async def stream_logs(self, write: Callable[[bytes], None], start_time: str | None = None) -> None:
        """The job's output from ``/logs_ws`` until the websocket closes (the job ended, all of it sent)."""
        reader, writer = await self.inner.open_connection("localhost", RUNNER_HTTP_PORT)
        key = base64.b64encode(os.urandom(16)).decode()
        from urllib.parse import urlencode

        query = f"?{urlencode({'start_time': start_time})}" if start_time else ""
        writer.write(
            (
                f"GET /logs_ws{query} HTTP/1.1\r\nHost: localhost:{RUNNER_HTTP_PORT}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status + b" ":
            raise AttachError(f"the job's logs answered {status.decode(errors='replace')}")
        try:
            while True:
                b0, b1 = await reader.readexactly(2)
                size = b1 & 0x7F
                if size == 126:
                    (size,) = struct.unpack(">H", await reader.readexactly(2))
                elif size == 127:
                    (size,) = struct.unpack(">Q", await reader.readexactly(8))
                mask = await reader.readexactly(4) if b1 & 0x80 else b""
                payload = await reader.readexactly(size) if size else b""
                if mask:
                    payload = bytes(c ^ mask[i % 4] for i, c in enumerate(payload))
                opcode = b0 & 0x0F
                if opcode == 0x8:
                    return
                if opcode in (0x0, 0x1, 0x2):
                    write(payload)
        except asyncio.IncompleteReadError:
            return
        finally:
            writer.close()

    async def close(self) -> None:
        for listener in self.listeners:
            listener.close()
        self.listeners.clear()
        for conn in (self.inner, self.outer):
            if conn is not None:
                conn.close()
                try:
                    await conn.wait_closed()
                except Exception:  # closing: nothing more to do
                    pass
        self.inner = self.outer = None
