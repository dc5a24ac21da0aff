"""SSH sessions and forwarded connections of the ``<run>`` hop, relayed to the job's agent.

A session (exec, shell, with or without a pty, the ``sftp`` subsystem) becomes one agent session
(``POST /jobs/{id}/exec``, :mod:`corral.backends.agent_session`): the client's input, window changes and
signals go to the agent as frames, the command's output and exit status come back; the command runs in
the job's sandbox as the job's user (:mod:`corral.agent.sessions`). Plain ``scp`` and ``sftp`` run the
host's sftp-server there, so files are read and written with the job's rights, never the server's.
A direct-tcpip channel to a port of the job becomes ``POST /jobs/{id}/connect``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import asyncssh

from corral.agent.protocol_session import EXIT, SIGNAL, STDERR, STDIN, STDIN_EOF, STDOUT, WINDOW, ExecRequest
from corral.backends.agent_client import AgentClientError
from corral.backends.agent_session import frame, open_stream, read_frame
from corral.services.ssh_access import JobAccess

log = logging.getLogger("corral.sshd")


class JobSession(asyncssh.SSHServerSession):  # type: ignore[type-arg]
    def __init__(self, access: JobAccess, on_close: Any = None) -> None:
        self._access = access
        self._req = ExecRequest()
        self._chan: Any = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: list[bytes] = []
        self._task: asyncio.Task[None] | None = None
        self._on_close = on_close

    def connection_made(self, chan: Any) -> None:
        self._chan = chan

    def pty_requested(self, term_type: str, term_size: tuple[int, int, int, int], term_modes: Any) -> bool:
        self._req.pty, self._req.term = True, term_type
        self._req.cols, self._req.rows = term_size[0] or 80, term_size[1] or 24
        return True

    def shell_requested(self) -> bool:
        return True

    def exec_requested(self, command: str) -> bool:
        self._req.command = command
        return True

    def subsystem_requested(self, subsystem: str) -> bool:
        if subsystem != "sftp":
            return False
        self._req.subsystem = "sftp"
        return True

    def session_started(self) -> None:
        self._req.env = {str(k): str(v) for k, v in (self._chan.get_environment() or {}).items()}
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        a = self._access
        try:
            if a.agent_url is None or a.agent_token is None or not a.running:
                raise AgentClientError(f"the job {a.job.job_name} is not running")
            reader, writer = await open_stream(a.agent_url, a.agent_token, a.job.id, "exec", self._req.to_dict())
        except AgentClientError as e:
            self._chan.write_stderr(f"corral: cannot open a session in the job: {e}\r\n".encode())
            self._chan.exit(255)
            return
        self._writer = writer
        for data in self._pending:
            writer.write(data)
        self._pending.clear()
        status: dict[str, Any] = {"status": 255, "signal": None}
        try:
            while (got := await read_frame(reader)) is not None:
                kind, payload = got
                if kind == STDOUT:
                    self._chan.write(payload)
                elif kind == STDERR:
                    self._chan.write_stderr(payload)
                elif kind == EXIT:
                    status = json.loads(payload)
                    break
        finally:
            writer.close()
            self._writer = None
        try:
            if status.get("signal"):
                self._chan.exit_with_signal(str(status["signal"]))
            else:
                self._chan.exit(int(status.get("status") or 0))
        except (OSError, asyncssh.Error):
            pass

    def _send(self, kind: bytes, payload: bytes = b"") -> None:
        data = frame(kind, payload)
        if self._writer is not None:
            self._writer.write(data)
        else:
            self._pending.append(data)

    def data_received(self, data: bytes, datatype: Any) -> None:
        self._send(STDIN, data)

    def eof_received(self) -> bool:
        self._send(STDIN_EOF)
        return True

    def terminal_size_changed(self, width: int, height: int, pixwidth: int, pixheight: int) -> None:
        self._send(WINDOW, json.dumps({"cols": width, "rows": height}).encode())

    def signal_received(self, signal: str) -> None:
        self._send(SIGNAL, signal.encode())

    def break_received(self, msec: int) -> bool:
        self._send(SIGNAL, b"INT")
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self._on_close is not None:
            self._on_close()


async def relay_port(access: JobAccess, port: int, reader: Any, writer: Any) -> None:
    """A direct-tcpip channel to the job's ``port``, relayed through the agent."""
    if access.agent_url is None or access.agent_token is None:
        writer.close()
        return
    try:
        up_r, up_w = await open_stream(access.agent_url, access.agent_token, access.job.id, "connect", {"port": port})
    except AgentClientError as e:
        log.info("forward to %s:%d refused: %s", access.job.job_name, port, e)
        writer.close()
        return
    await pipe_both(reader, writer, up_r, up_w)


async def pipe_both(r1: Any, w1: Any, r2: Any, w2: Any) -> None:
    async def copy(src: Any, dst: Any) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (OSError, asyncssh.Error, asyncio.IncompleteReadError):
            pass
        finally:
            try:
                dst.write_eof()
            except (OSError, asyncssh.Error, AttributeError, RuntimeError):
                pass

    try:
        await asyncio.gather(copy(r1, w2), copy(r2, w1))
    finally:
        w1.close()
        w2.close()
