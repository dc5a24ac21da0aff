"""A local port forwarded to a remote end: every connection to ``127.0.0.1:<port>`` is piped both ways to a
stream that an *opener* (a coroutine) opens for it. The listener, the pipes and their ending are here; what the
remote end is belongs to the caller: an SSH fleet's host link opens a channel to the agent's port on the host
(:mod:`corral.backends.ssh_conn`), a Slurm cluster a channel through its login node to the agent on a node
(:mod:`corral.backends.slurm.compute`).

An opener that raises leaves the client with a closed connection (its caller sees the agent as unreachable,
and tries again); it is asked again on the next connection.

May import: the standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Protocol

log = logging.getLogger("corral.forward")

CHUNK = 65536


class ByteReader(Protocol):
    """The reading half of a stream (asyncio's ``StreamReader``, asyncssh's ``SSHReader``)."""

    async def read(self, n: int = -1) -> bytes: ...


class ByteWriter(Protocol):
    """The writing half of a stream (asyncio's ``StreamWriter``, asyncssh's ``SSHWriter``)."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def can_write_eof(self) -> bool: ...

    def write_eof(self) -> None: ...

    def close(self) -> None: ...


#: Opens ``(reader, writer)`` to the remote end for one local connection (raises when nothing answers).
Opener = Callable[[], Awaitable[tuple[ByteReader, ByteWriter]]]


async def pipe(reader: ByteReader, writer: ByteWriter) -> None:
    """Copy ``reader`` to ``writer`` until its end, then pass the end on (EOF where the writer has one)."""
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except Exception:  # the other end went away (OSError, asyncssh's errors, an incomplete read)
        pass
    finally:
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()
            else:
                writer.close()


class LocalForward:
    """A listener on 127.0.0.1 (``local_url``) whose connections are piped to what ``opener`` opens."""

    def __init__(self, opener: Opener, label: str) -> None:
        self._open = opener
        #: What the remote end is, for the log (``user@host:port``, ``node:port``).
        self.label = label
        self._sock: socket.socket | None = None
        self._server: asyncio.AbstractServer | None = None
        self._starting: asyncio.Task[None] | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    def local_url(self) -> str:
        """``http://127.0.0.1:PORT``, listening from now on (the same for the life of the forward)."""
        if self._sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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
            except Exception as e:  # the host, the node or its agent is gone: the client sees a closed connection
                log.debug("%s: no tunnel: %s", self.label, e)
                return
            await asyncio.gather(pipe(reader, remote_writer), pipe(remote_reader, writer))
        except asyncio.CancelledError:
            pass  # the forward is closing; ending quietly keeps asyncio's server callback from logging it
        finally:
            with contextlib.suppress(Exception):
                writer.close()
            if task is not None:
                self._pipes.discard(task)

    async def close(self) -> None:
        """Stop listening and end the open connections."""
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
