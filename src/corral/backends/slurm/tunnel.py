"""A local port forwarded to an agent on a Slurm node: every connection to ``127.0.0.1:<port>`` is a
direct-tcpip channel through the cluster's login node (``SlurmCluster.open_connection``) to the agent's
address, so the server reaches agents on nodes it cannot route to, over the one SSH connection per cluster.

May import: the standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger("corral.slurm")

#: Opens ``(reader, writer)`` to the agent (raises when nothing answers).
Opener = Callable[[], Awaitable[tuple[Any, Any]]]


async def _pipe(reader: Any, writer: Any) -> None:
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except Exception:  # the other end went away (OSError, asyncssh's errors)
        pass
    finally:
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()
            else:
                writer.close()


class Tunnel:
    """The local end (``local_url``) of the way to one agent."""

    def __init__(self, opener: Opener, label: str) -> None:
        self._open = opener
        self.label = label
        self._sock: socket.socket | None = None
        self._server: asyncio.AbstractServer | None = None
        self._starting: asyncio.Task[None] | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    def local_url(self) -> str:
        """``http://127.0.0.1:PORT``, listening from now on (the same for the life of the tunnel)."""
        if self._sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sock.listen(64)
            sock.setblocking(False)
            self._sock = sock
            self._starting = asyncio.get_running_loop().create_task(self._serve(sock))
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    async def _serve(self, sock: socket.socket) -> None:
        self._server = await asyncio.start_server(self._forward, sock=sock)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._pipes.add(task)
        try:
            try:
                remote_reader, remote_writer = await self._open()
            except Exception as e:  # the node or its agent is gone: the client sees a closed connection
                log.debug("%s: no tunnel: %s", self.label, e)
                return
            await asyncio.gather(_pipe(reader, remote_writer), _pipe(remote_reader, writer))
        except asyncio.CancelledError:
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
            if task is not None:
                self._pipes.discard(task)

    async def close(self) -> None:
        if self._starting is not None:
            with contextlib.suppress(Exception):
                await self._starting
        if self._server is not None:
            self._server.close()
        elif self._sock is not None:
            self._sock.close()
        for task in list(self._pipes):
            task.cancel()
        if self._pipes:
            await asyncio.gather(*self._pipes, return_exceptions=True)
