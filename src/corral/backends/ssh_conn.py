"""SSH connections to the hosts of SSH fleets (asyncssh).

A :class:`HostLink` owns one host's SSH connection -- made through the host's ``proxy_jump`` when it
has one, reused by every command and tunnel, and made again on demand after it drops -- and a local
TCP listener on 127.0.0.1 (:class:`~corral.backends.local_forward.LocalForward`) whose every connection is
forwarded over that SSH connection to the agent's port on the host's loopback. The agent never listens on a
public address; the server reaches it only through this tunnel, at a local URL that stays the same for the
life of the server process.

A handshake slower than a health check's patience is not abandoned: one connection attempt at a time
runs up to ``connect_timeout`` and every caller shares its outcome, so a slow host is reached by the
next check instead of being declared dead by the first.

A target's ``private_key`` is the key as stored (sealed at rest, see :mod:`corral.backends.ssh_secrets`):
the link's ``open_key`` turns it into the key itself right before each login, and nothing else does.

Failures come out as :class:`SshError`, ``permanent`` when trying again cannot help (the key was
refused, the key cannot be read or opened) and transient otherwise (no route, refused, timed out, dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral.backends.local_forward import ByteReader, ByteWriter, LocalForward
from corral.backends.ssh_secrets import KeyOpener

if TYPE_CHECKING:
    import asyncssh

log = logging.getLogger("corral.ssh")

KEEPALIVE_INTERVAL = 15.0

#: The ciphers asked for first, ahead of asyncssh's own list (``^``: put at the head of the default set, as in
#: OpenSSH's ``ssh_config(5)`` ``Ciphers``; asyncssh reads the same syntax: its docs, "Specifying algorithms").
#: Every byte between the server and a host's agent (submissions, logs, health checks, metrics) crosses the SSH
#: connection, and asyncssh makes ``chacha20-poly1305@openssh.com``, its first choice, of several calls into
#: ``cryptography`` per packet: 33 µs a packet of 300 bytes here, against 5 µs for ``aes128-gcm@openssh.com``
#: (one AEAD call). OpenSSH's sshd offers both AES-GCM ciphers by default since 6.2 (its ``sshd_config(5)``
#: ``Ciphers`` default); a host that does not is reached with the rest of the default set, as before.
CIPHERS = "^aes128-gcm@openssh.com,aes256-gcm@openssh.com"


def _asyncssh() -> Any:
    """asyncssh, imported on first use: a server without SSH fleets never pays for it (16 MB, 0.16 s)."""
    import asyncssh

    return asyncssh


class SshError(Exception):
    """Reaching a host over SSH failed; the message names the host and says why."""

    def __init__(
        self, message: str, permanent: bool = False, login_refused: bool = False, session_refused: bool = False
    ) -> None:
        super().__init__(message)
        self.permanent = permanent
        #: The connection is up but the host refused one more session on it (try again shortly).
        self.session_refused = session_refused
        #: The host did not accept the key (permanent for a host someone set up; a new cloud instance may
        #: not have authorised it yet).
        self.login_refused = login_refused


@dataclass(frozen=True)
class SshTarget:
    """Where and as whom to log in (``proxy``: the jump host to go through first). ``private_key`` is
    the key as stored (possibly sealed): :class:`HostLink` opens it only to log in."""

    host: str
    port: int
    user: str
    private_key: str
    proxy: SshTarget | None = None

    def label(self) -> str:
        text = f"{self.user}@{self.host}:{self.port}"
        return f"{text} (via {self.proxy.label()})" if self.proxy else text

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "private_key": self.private_key,
            "proxy_jump": self.proxy.to_json() if self.proxy else None,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> SshTarget:
        proxy = data.get("proxy_jump")
        return SshTarget(
            host=str(data["host"]),
            port=int(data.get("port") or 22),
            user=str(data["user"]),
            private_key=str(data["private_key"]),
            proxy=SshTarget.from_json(proxy) if proxy else None,
        )


def private_key_problem(text: str) -> str | None:
    """Why ``text`` cannot be used as an SSH private key (None when it can)."""
    try:
        _asyncssh().import_private_key(text)
    except _asyncssh().KeyImportError as e:
        if "passphrase" in str(e).lower():
            return "the private key is protected by a passphrase; corral needs a key without one"
        return f"the private key cannot be read ({e})"
    return None


async def _open(
    target: SshTarget,
    timeout: float,
    tunnel: asyncssh.SSHClientConnection | None,
    open_key: Callable[[str], str],
) -> asyncssh.SSHClientConnection:
    try:
        text = open_key(target.private_key)
    except ValueError as e:  # the stored key cannot be opened (ssh_secrets.KeyUnreadable)
        raise SshError(f"{target.label()}: {e}", permanent=True) from None
    try:
        key = _asyncssh().import_private_key(text)
    except _asyncssh().KeyImportError as e:
        raise SshError(f"{target.label()}: the private key cannot be read ({e})", permanent=True) from None
    try:
        return await asyncio.wait_for(
            _asyncssh().connect(
                target.host,
                target.port,
                tunnel=tunnel if tunnel is not None else (),
                username=target.user,
                client_keys=[key],
                known_hosts=None,  # hosts are named by the fleet's owner, as with dstack (no known_hosts)
                agent_path=None,
                config=None,
                preferred_auth="publickey",
                connect_timeout=timeout,
                keepalive_interval=KEEPALIVE_INTERVAL,
                keepalive_count_max=3,
                encryption_algs=CIPHERS,
            ),
            timeout + 1.0,
        )
    except _asyncssh().PermissionDenied:
        raise SshError(
            f"{target.label()}: the login was refused: the host did not accept the key for user {target.user!r} "
            "(check `user` and `identity_file`)",
            permanent=True,
            login_refused=True,
        ) from None
    except (asyncio.TimeoutError, TimeoutError):
        raise SshError(f"{target.label()}: no SSH answer within {timeout:.0f}s") from None
    except ConnectionRefusedError:
        raise SshError(
            f"{target.label()}: the connection was refused (is sshd listening on port {target.port}?)"
        ) from None
    except OSError as e:
        raise SshError(f"{target.label()}: cannot connect: {e.strerror or e}") from None
    except _asyncssh().Error as e:
        raise SshError(f"{target.label()}: SSH failed: {e}") from None


class HostLink:
    """One host: a reused SSH connection and the local end of the tunnel to its agent."""

    def __init__(
        self,
        target: SshTarget,
        connect_timeout: float,
        agent_port: Callable[[HostLink], Awaitable[int]],
        open_key: Callable[[str], str] = KeyOpener(),
    ) -> None:
        self.target = target
        #: Turns a stored private key into the key (raises ``ValueError`` saying why it cannot); the
        #: default opens keys stored in clear only.
        self._open_key = open_key
        self.connect_timeout = connect_timeout
        self._read_agent_port = agent_port
        #: The agent's port on the host's loopback (read from its port file when unknown).
        self.remote_port: int | None = None
        self._conn: asyncssh.SSHClientConnection | None = None
        self._jump: asyncssh.SSHClientConnection | None = None
        self._connecting: asyncio.Future[asyncssh.SSHClientConnection] | None = None
        #: The local end of the tunnel to the agent.
        self._forward = LocalForward(self._open_agent, target.label())
        self._closed = False

    # ---- the SSH connection ------------------------------------------------------------------
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    async def connection(self) -> asyncssh.SSHClientConnection:
        """The open connection, or one made now (every caller shares one attempt in flight)."""
        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        if self._closed:
            raise SshError(f"{self.target.label()}: the link was closed")
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.ensure_future(self._connect())
            self._connecting.add_done_callback(_retrieve)
        return await asyncio.shield(self._connecting)

    async def _connect(self) -> asyncssh.SSHClientConnection:
        self._drop()
        jump = None
        if self.target.proxy is not None:
            try:
                jump = await _open(self.target.proxy, self.connect_timeout, None, self._open_key)
            except SshError as e:
                raise SshError(f"proxy jump {e}", e.permanent) from None
        try:
            conn = await _open(self.target, self.connect_timeout, jump, self._open_key)
        except BaseException:
            if jump is not None:
                jump.close()
            raise
        self._jump, self._conn = jump, conn
        log.debug("connected to %s", self.target.label())
        return conn

    def _drop(self) -> None:
        for conn in (self._conn, self._jump):
            if conn is not None:
                conn.close()
        self._conn = self._jump = None

    async def run(self, command: str, input: bytes | str | None = None, timeout: float = 60.0) -> Any:
        """Run ``command`` on the host (through its login shell); returns asyncssh's completed process."""
        conn = await self.connection()
        data = input.encode() if isinstance(input, str) else input
        try:
            # asyncssh's conn.run, with the input written here: a command may end (and the host close its channel)
            # before its input is written -- a login shell that runs nothing (nologin) does that at once. Its output
            # and exit status say why; the connection is fine.
            proc = await conn.create_process(command, encoding=None)
            if data:
                with contextlib.suppress(BrokenPipeError):
                    proc.stdin.write(data)
                    proc.stdin.write_eof()
            return await proc.wait(check=False, timeout=timeout)
        except _asyncssh().TimeoutError:
            raise SshError(f"{self.target.label()}: a command did not finish within {timeout:.0f}s") from None
        except _asyncssh().ChannelOpenError as e:  # the host refused a session (sshd's MaxSessions): the link is fine
            raise SshError(f"{self.target.label()}: the host refused a session: {e}", session_refused=True) from None
        except (_asyncssh().Error, OSError) as e:
            self._drop()
            raise SshError(f"{self.target.label()}: the connection broke: {e}") from None

    # ---- the tunnel to the agent -------------------------------------------------------------
    def local_url(self) -> str:
        """``http://127.0.0.1:PORT``: a local port forwarded to the agent (listening from now on)."""
        return self._forward.local_url()

    async def _open_agent(self) -> tuple[ByteReader, ByteWriter]:
        """A channel to the agent's port on the host's loopback (its port read from its port file when unknown)."""
        conn = await self.connection()
        if self.remote_port is None:
            self.remote_port = await self._read_agent_port(self)
        try:
            return await conn.open_connection("127.0.0.1", self.remote_port)
        except _asyncssh().ChannelOpenError:
            self.remote_port = None  # the agent moved or is down: read its port file again next time
            raise

    async def close(self) -> None:
        """Stop listening, end open tunnels and close the SSH connection."""
        self._closed = True
        await self._forward.close()
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
        self._drop()


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a shared connection attempt's failure as seen (its callers may all have gone)."""
    if not future.cancelled():
        future.exception()
