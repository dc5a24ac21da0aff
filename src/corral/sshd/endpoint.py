"""The listener and its two hops, in dstack's ``dockerized`` layout (what the official CLI writes for it:
``Host <run>-host`` at ``job_provisioning_data.hostname:ssh_port`` as ``job_provisioning_data.username``,
and ``Host <run>`` at ``localhost:<job_runtime_data.ports[10022]>`` through it with ``ProxyJump``).

* **The outer hop** (``<run>-host``): its user name is the job's id, which names the job; public-key
  authentication against that job's keys (:mod:`corral.services.ssh_access`); no session, and only one
  forwarded channel: to ``localhost:10022``, the job's own SSH server.
* **The inner hop** (``<run>``): an SSH server connection run over that channel (a socket pair between
  the channel and asyncssh), again with the job's keys, as ``root`` or the job's user: sessions and
  forwards into the job (:mod:`corral.sshd.sessions`), ``localhost:10999`` the job's ``/logs_ws``
  (:mod:`corral.sshd.logs_ws`).

A connection stays while its job is admitted (running, or ended within the grace period and not stopped):
one watcher for all connections (one query a tick, however many are open) closes it when a stop ends the
job, and records the connections that count as the jobs' activity. The host key is made when the endpoint
starts and lives in memory only (the CLI's entries switch host-key checking off, as dstack's do).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

import asyncssh

from corral.context import Context
from corral.domain import inactivity
from corral.services import ssh_access
from corral.services.ssh_access import JobAccess
from corral.sshd import logs_ws
from corral.sshd.sessions import JobSession, pipe_both, relay_port

log = logging.getLogger("corral.sshd")

#: The ``<run>`` hop's port as the CLI reaches it through the outer hop (``job_runtime_data.ports``).
CONTAINER_SSH_PORT = 10022
_LOCAL = ("localhost", "127.0.0.1", "::1")
WATCH_S = 1.0
SEEN_EVERY_S = 2.0


class Endpoint:
    """The SSH endpoint, started on first use (:meth:`ensure`) so that the server's start-up pays nothing."""

    def __init__(self, ctx: Context, host: str, port: int, hostname: str) -> None:
        self.ctx = ctx
        self.host, self.port, self.hostname = host, port, hostname
        self._server: Any = None
        self._lock = asyncio.Lock()
        self._key: Any = None
        #: Live outer connections by job id (closed when their job stops), and when each was opened.
        self.connections: dict[str, set[Any]] = {}
        self._opened: dict[Any, float] = {}
        #: When each job's activity was last recorded by the watcher.
        self._recorded: dict[str, float] = {}
        self._watcher: asyncio.Future[None] | None = None
        self._beats: set[asyncio.Future[None]] = set()

    async def ensure(self) -> tuple[str, int]:
        """Listen (once); the address the CLI should reach (``hostname``, ``ssh_port``)."""
        async with self._lock:
            if self._server is None:
                self._key = asyncssh.generate_private_key("ssh-ed25519")
                self._server = await asyncssh.listen(
                    self.host,
                    self.port,
                    server_factory=lambda: _Outer(self),
                    server_host_keys=[self._key],
                    **_options(),
                )
                sockets = self._server.sockets
                self.port = int(sockets[0].getsockname()[1])
                log.info("SSH endpoint of jobs listening on %s:%d", self.host, self.port)
        return self.hostname, self.port

    async def close(self) -> None:
        """Stop listening and close every connection (server shutdown)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for conns in list(self.connections.values()):
            for conn in list(conns):
                conn.close()
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
            self._watcher = None
        if self._beats:
            await asyncio.gather(*self._beats, return_exceptions=True)

    def track(self, job_id: str, conn: Any) -> Callable[[], None]:
        """Watch ``conn`` (an outer connection into ``job_id``) until it closes: the watcher closes it when
        its job no longer admits it, and records it as the job's activity while it counts."""
        conns = self.connections.setdefault(job_id, set())
        conns.add(conn)
        self._opened[conn] = time.time()
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.ensure_future(self._watch())

        def untrack() -> None:
            opened = self._opened.pop(conn, None)
            conns.discard(conn)
            if not conns:
                self.connections.pop(job_id, None)
            now = time.time()
            if opened is not None and inactivity.counts(opened, now):  # its inactivity starts when this one closes
                beat = asyncio.ensure_future(self._seen([job_id], now))
                self._beats.add(beat)
                beat.add_done_callback(self._beats.discard)

        return untrack

    async def _seen(self, job_ids: list[str], now: float) -> None:
        try:
            await ssh_access.record_seen(self.ctx, job_ids, now)
        except Exception as e:  # the database may be away for a moment: the next beat records it
            log.warning("cannot record SSH activity of %d job(s): %s", len(job_ids), e)

    async def _watch(self) -> None:
        """Every :data:`WATCH_S`, for all open connections at once (one query, at most one update): close
        those whose job no longer admits them (stopped, deleted, or past its grace), and record as activity,
        every :data:`SEEN_EVERY_S`, the running jobs with a connection open for 10 s or more."""
        while self.connections:
            await asyncio.sleep(WATCH_S)
            job_ids = list(self.connections)
            try:
                running = await ssh_access.admitted(self.ctx, job_ids, time.time())
            except Exception as e:  # the database is away for a moment: keep the connections, look again
                log.warning("cannot check the jobs of open SSH connections: %s", e)
                continue
            now = time.time()
            due: list[str] = []
            for job_id in job_ids:
                conns = list(self.connections.get(job_id, ()))
                if job_id not in running:
                    for conn in conns:
                        conn.close()
                    continue
                counting = any(inactivity.counts(self._opened.get(c, now), now) for c in conns)
                if running[job_id] and counting and now - self._recorded.get(job_id, 0.0) >= SEEN_EVERY_S:
                    due.append(job_id)
                    self._recorded[job_id] = now
            for job_id in [j for j in self._recorded if j not in self.connections]:
                del self._recorded[job_id]
            if due:
                await self._seen(due, now)

    async def inner(self, access: JobAccess, reader: Any, writer: Any) -> None:
        """Run the ``<run>`` hop's SSH server over a forwarded channel."""
        ours, theirs = socket.socketpair()
        r, w = await asyncio.open_connection(sock=ours)
        piping = asyncio.ensure_future(pipe_both(reader, writer, r, w))
        try:
            conn = await asyncssh.run_server(
                theirs, server_factory=lambda: _Inner(self, access), server_host_keys=[self._key], **_options()
            )
        except (OSError, asyncssh.Error) as e:
            log.info("inner SSH hop of %s failed: %s", access.job.job_name, e)
            piping.cancel()
            return
        try:
            await piping
        finally:
            conn.close()


def _options() -> dict[str, Any]:
    return {
        "encoding": None,
        "line_editor": False,
        "allow_scp": False,
        "sftp_factory": None,
        "agent_forwarding": False,
        "x11_forwarding": False,
        "login_timeout": 30,
        "keepalive_interval": 30,
    }


def _keys(access: JobAccess) -> Any:
    try:
        return asyncssh.import_authorized_keys("\n".join(access.keys))
    except (ValueError, asyncssh.Error):
        # one malformed key must not lock the others out
        good = []
        for k in access.keys:
            try:
                asyncssh.import_authorized_keys(k)
                good.append(k)
            except (ValueError, asyncssh.Error):
                continue
        return asyncssh.import_authorized_keys("\n".join(good)) if good else None


class _Auth(asyncssh.SSHServer):
    """Public keys only, those of the connection's job."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.conn: Any = None
        self.access: JobAccess | None = None
        self._untrack: Callable[[], None] | None = None

    def connection_made(self, conn: Any) -> None:
        self.conn = conn

    def connection_lost(self, exc: Exception | None) -> None:
        if self._untrack is not None:
            self._untrack()

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    def _admit(self, access: JobAccess | None) -> bool:
        keys = _keys(access) if access is not None and access.reachable(time.time()) else None
        if keys is None:
            self.conn.set_authorized_keys(asyncssh.import_authorized_keys(""))
        else:
            self.conn.set_authorized_keys(keys)
        self.access = access if keys is not None else None
        return True

    def auth_completed(self) -> None:
        if self.access is not None:
            self._untrack = self.endpoint.track(self.access.job.id, self.conn)


class _Outer(_Auth):
    async def begin_auth(self, username: str) -> bool:
        try:
            access = await ssh_access.job_access(self.endpoint.ctx, username)
        except Exception:
            log.exception("SSH login as %r: cannot look the job up", username)
            access = None
        if access is None or not access.reachable(time.time()):
            log.info("SSH login as %r refused: no such job, or it is not running", username)
        return self._admit(access)

    def session_requested(self) -> bool:
        return False

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int) -> Any:
        access = self.access
        if access is None or dest_host not in _LOCAL or dest_port != CONTAINER_SSH_PORT:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
                f"this hop forwards only to localhost:{CONTAINER_SSH_PORT} (the job's SSH server)",
            )

        async def handler(reader: Any, writer: Any) -> None:
            await self.endpoint.inner(access, reader, writer)

        return handler

    def server_requested(self, listen_host: str, listen_port: int) -> bool:
        return False


class _Inner(_Auth):
    def __init__(self, endpoint: Endpoint, outer: JobAccess) -> None:
        super().__init__(endpoint)
        self.outer = outer

    async def begin_auth(self, username: str) -> bool:
        try:
            access = await ssh_access.job_access(self.endpoint.ctx, self.outer.job.id)
        except Exception:
            log.exception("SSH login into job %s: cannot look the job up", self.outer.job.job_name)
            access = None
        if access is not None and username not in ("root", access.username):
            access = None
        return self._admit(access)

    def auth_completed(self) -> None:
        return  # the outer hop's connection is the one a stop closes

    def session_requested(self) -> Any:
        assert self.access is not None
        return JobSession(self.access)

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int) -> Any:
        access = self.access
        if access is None or dest_host not in _LOCAL:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, "only the job's own ports (localhost:PORT) are forwarded"
            )
        ctx = self.endpoint.ctx
        if dest_port == logs_ws.RUNNER_HTTP_PORT:

            async def logs(reader: Any, writer: Any) -> None:
                await logs_ws.serve(ctx, access.job.id, reader, writer)

            return logs

        async def port(reader: Any, writer: Any) -> None:
            await relay_port(access, dest_port, reader, writer)

        return port

    def server_requested(self, listen_host: str, listen_port: int) -> bool:
        return False
