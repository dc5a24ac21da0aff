"""The server's channel to a gateway's host: the gateway process deployed there, started, reached, stopped.

A gateway runs on an SSH fleet's host as the process of ``corral.gateway`` (its own zipapp, standard library
only). Everything corral puts there lives in ``~/.corral-gateway`` of the login user: the zipapp and its
content hash (uploaded again only when the build differs), the management token (mode 0600, written at each
deploy, read by the process from its file so that it never shows in the host's process list), the state
directory (the process keeps its services and certificates there), its log, its pid and the port of its
management API on the host's loopback.

The process is started detached (``setsid nohup``, the agent's way: it survives the SSH session and the
server). It binds ports 80 and 443 of the host, which needs root: a login that cannot bind them gets a
failure that says so. A deploy finding the process alive with the same token and build adopts it (a
restarted server, a retried deploy) instead of starting another.

Over the host's SSH connection (a :class:`~corral.backends.ssh_conn.HostLink`, made again after it drops)
the link keeps two forwards:

* **local**: a port on this machine's loopback forwarded to the management API (``management_url``; the
  URL stays the same for the life of the server process, across reconnections);
* **reverse**: a port on the host's loopback forwarded to the server's own HTTP port (``server_url``: what the
  gateway is configured with, ``PUT /api/config``). After a reconnection the same host port is asked for
  again; should it be taken, another one is opened and :attr:`GatewayLink.generation` moves on, so that the
  caller configures the gateway again.

Removal stops the process and removes the directory: ports 80 and 443 are closed afterwards.

May import: the standard library, ``backends.ssh_conn`` and ``backends.ssh_secrets`` (asyncssh through them,
imported on first use).
"""

from __future__ import annotations

import hashlib
import logging
import shlex
from dataclasses import dataclass
from typing import Any, Protocol

from corral.backends.ssh_conn import HostLink, SshError, SshTarget
from corral.backends.ssh_secrets import KeyOpener

log = logging.getLogger("corral.gateways")

GATEWAY_DIR = ".corral-gateway"
ZIPAPP = "corral-gateway.pyz"
#: How long a started process has to open its management port.
START_WAIT = 15.0
#: The message of a start refused because the login cannot bind the gateway's ports.
NEEDS_ROOT = (
    "the gateway must listen on ports 80 and 443 of the host, which needs root; user {user} (uid {uid}) "
    "cannot bind them: log in to the fleet's hosts as root"
)


@dataclass(frozen=True)
class GatewayBuild:
    """The gateway zipapp to deploy and its content hash."""

    data: bytes
    digest: str

    @staticmethod
    def of(data: bytes) -> GatewayBuild:
        return GatewayBuild(data, hashlib.sha256(data).hexdigest())


@dataclass(frozen=True)
class Deployed:
    """A gateway process running on its host: its management port there, its pid, whether it was running
    already (adopted) and whether the zipapp was uploaded by this deploy."""

    management_port: int
    pid: int | None
    adopted: bool
    uploaded: bool


class GatewayChannel(Protocol):
    """What the gateways' operation needs of a gateway's host, wherever it is: an SSH fleet's host or a VM
    (:class:`GatewayLink`), or this server's own machine (``gateway_local.LocalGatewayLink``)."""

    @property
    def label(self) -> str: ...

    #: Moves on each time the server's address as the gateway reaches it changes: configure the gateway again.
    generation: int

    async def deploy(self, build: GatewayBuild, token: str) -> Deployed: ...

    async def remove(self) -> None: ...

    def management_url(self) -> str: ...

    async def server_url(self) -> str: ...

    async def close(self) -> None: ...


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


def _tail(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else "..." + text[-limit:]


def _values(out: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


UPLOAD = (
    'D="$HOME/{dir}"; mkdir -p "$D" && [ "$(cat "$D/{zipapp}.hash" 2>/dev/null)" = {digest} ] '
    "&& echo same=1 && exit 0; "
    'cat > "$D/.{zipapp}.tmp" && mv -f "$D/.{zipapp}.tmp" "$D/{zipapp}" && echo {digest} > "$D/{zipapp}.hash" '
    "&& echo uploaded=1"
)


def start_script(token: str, http: str, https: str, digest: str, wait: float) -> str:
    """Write the token (0600); keep a process started with this token and build, else stop the old one and
    start the gateway detached on a free loopback port; print its management port and pid (or why it failed).

    Run by ``sh -s`` from stdin, so the token never shows in the host's process list."""
    free_port = "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"
    probe = (
        "import socket,sys; s=socket.socket(); s.settimeout(0.5); "
        "sys.exit(0 if s.connect_ex(('127.0.0.1', int(sys.argv[1]))) == 0 else 1)"
    )
    lines = [
        "set -u",
        f'D="$HOME/{GATEWAY_DIR}"; cd "$D" || exit 1',
        'py=$(command -v python3 2>/dev/null) || { echo "failed=python3 is not installed on the host"; exit 0; }',
        "mkdir -p state",
        "umask 077",
        "cat > token.new <<'CORRAL_TOKEN'",
        token,
        "CORRAL_TOKEN",
        f"echo {digest} {shlex.quote(http)} {shlex.quote(https)} > build.new",
        "same=0; cmp -s token.new token 2>/dev/null && cmp -s build.new build 2>/dev/null && same=1",
        "mv -f token.new token; mv -f build.new build",
        "umask 022",
        "pid=$(cat gateway.pid 2>/dev/null || true); port=$(cat gateway.port 2>/dev/null || true)",
        'alive=0; [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && alive=1',
        f'if [ "$alive" = 1 ] && [ "$same" = 1 ] && [ -n "$port" ] && "$py" -c "{probe}" "$port"; then',
        '  echo adopted=1; echo "port=$port"; echo "pid=$pid"; exit 0',
        "fi",
        'if [ "$alive" = 1 ]; then kill "$pid" 2>/dev/null; n=0; while kill -0 "$pid" 2>/dev/null && [ "$n" -lt 50 ];'
        ' do n=$((n+1)); sleep 0.1; done; kill -9 "$pid" 2>/dev/null; fi',
        "rm -f gateway.pid gateway.port",
        f'port=$("$py" -c "{free_port}")',
        f'setsid nohup "$py" -I {ZIPAPP} serve --state-dir "$D/state" --management "127.0.0.1:$port"'
        f' --token-file "$D/token" --http {shlex.quote(http)} --https {shlex.quote(https)}'
        " >> gateway.log 2>&1 < /dev/null &",
        "child=$!",
        'echo "$child" > gateway.pid',
        f"n=0; limit={max(1, int(wait * 10))}",
        f'until "$py" -c "{probe}" "$port"; do',
        '  if ! kill -0 "$child" 2>/dev/null; then',
        '    echo "uid=$(id -u)"; echo "failed=the gateway exited: $(tail -n 5 gateway.log | tr "\\n" " ")"; exit 0',
        "  fi",
        '  n=$((n+1)); [ "$n" -gt "$limit" ] && { echo "failed=the gateway did not start in time"; exit 0; }',
        "  sleep 0.1",
        "done",
        'echo "$port" > gateway.port',
        'echo "port=$port"; echo "pid=$child"',
    ]
    return "\n".join(lines) + "\n"


REMOVE = f"""D="$HOME/{GATEWAY_DIR}"
pid=$(cat "$D/gateway.pid" 2>/dev/null || true)
if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
  kill "$pid" 2>/dev/null
  n=0; while kill -0 "$pid" 2>/dev/null && [ "$n" -lt 100 ]; do n=$((n+1)); sleep 0.1; done
  kill -9 "$pid" 2>/dev/null
fi
rm -rf "$D"
echo removed=1
"""


class GatewayLink:
    """One gateway host: the deployed process and the two forwards (see the module's docstring)."""

    def __init__(
        self,
        target: SshTarget,
        connect_timeout: float,
        server_port: int,
        open_key: KeyOpener | None = None,
        server_host: str = "127.0.0.1",
        http: str = "0.0.0.0:80",
        https: str = "0.0.0.0:443",
    ) -> None:
        self.link = HostLink(target, connect_timeout, self._read_port, open_key or KeyOpener())
        #: The server's own HTTP address on this machine (the reverse forward's destination).
        self.server_host, self.server_port = server_host, server_port
        self.http, self.https = http, https
        #: The management port on the host's loopback (known after a deploy or read from its file).
        self.management_port: int | None = None
        self._reverse: Any = None  # asyncssh's SSHListener of the reverse forward
        self._reverse_on: Any = None  # the connection it was opened on
        self._reverse_port: int | None = None
        #: Moves on each time the reverse forward's host port changes: the gateway must be configured again.
        self.generation = 0

    @property
    def label(self) -> str:
        return self.link.target.label()

    # ---- the process -------------------------------------------------------------------------
    async def deploy(self, build: GatewayBuild, token: str) -> Deployed:
        """Upload the zipapp (when the host's differs) and start the process (or adopt the one running)."""
        if not token.isalnum():
            raise ValueError("the gateway's management token must be alphanumeric")
        upload = UPLOAD.format(dir=GATEWAY_DIR, zipapp=ZIPAPP, digest=build.digest)
        result = await self.link.run(upload, input=build.data, timeout=120)
        out = _values(_text(result.stdout))
        if "same" not in out and "uploaded" not in out:
            said = _tail(_text(result.stderr)) or f"exit status {result.exit_status}"
            raise SshError(f"{self.label}: cannot write ~/{GATEWAY_DIR}: {said}", permanent=True)
        script = start_script(token, self.http, self.https, build.digest, START_WAIT)
        result = await self.link.run("sh -s", input=script, timeout=START_WAIT + 30)
        values = _values(_text(result.stdout))
        if "failed" in values:
            why = values["failed"].strip()
            uid = values.get("uid", "").strip()
            if uid not in ("", "0") and ("ermission" in why or "denied" in why.lower()):
                why = NEEDS_ROOT.format(user=self.link.target.user, uid=uid) + f" ({why})"
            raise SshError(f"{self.label}: {why}", permanent=True)
        try:
            port = int(values["port"])
        except (KeyError, ValueError):
            said = _tail(_text(result.stdout) + " " + _text(result.stderr)) or f"exit status {result.exit_status}"
            raise SshError(f"{self.label}: starting the gateway failed: {said}") from None
        self.management_port = self.link.remote_port = port
        pid = values.get("pid", "").strip()
        return Deployed(port, int(pid) if pid.isdigit() else None, values.get("adopted") == "1", "uploaded" in out)

    async def _read_port(self, _link: HostLink) -> int:
        """The management port from the host's port file (a link made again after a server restart)."""
        result = await self.link.run(f'cat "$HOME/{GATEWAY_DIR}/gateway.port"', timeout=30)
        try:
            self.management_port = int(_text(result.stdout).strip())
        except ValueError:
            raise SshError(f"{self.label}: the gateway is not running (no port file)") from None
        return self.management_port

    async def remove(self) -> None:
        """Stop the process and remove everything corral put on the host for the gateway."""
        result = await self.link.run("sh -s", input=REMOVE, timeout=60)
        if "removed=1" not in _text(result.stdout).splitlines():
            raise SshError(f"{self.label}: removing the gateway failed: {_tail(_text(result.stderr))}")
        self.management_port = self.link.remote_port = None

    # ---- the forwards ------------------------------------------------------------------------
    def management_url(self) -> str:
        """``http://127.0.0.1:PORT`` on this machine, forwarded to the management API on the host."""
        return self.link.local_url()

    async def server_url(self) -> str:
        """``http://127.0.0.1:R``: the host's end of the reverse forward to the server (opened now if the
        connection is new; the same ``R`` as before when the host still has it free)."""
        conn = await self.link.connection()
        if self._reverse is None or self._reverse_on is not conn:
            if self._reverse is not None:
                self._reverse.close()
                self._reverse = None
            wanted = self._reverse_port or 0
            try:
                listener = await conn.forward_remote_port("127.0.0.1", wanted, self.server_host, self.server_port)
            except Exception as e:  # asyncssh: the port is taken, or forwarding is refused by sshd
                if not wanted:
                    raise SshError(f"{self.label}: the host refused to forward a port to the server: {e}") from None
                try:
                    listener = await conn.forward_remote_port("127.0.0.1", 0, self.server_host, self.server_port)
                except Exception as e2:
                    raise SshError(f"{self.label}: the host refused to forward a port to the server: {e2}") from None
            port = int(listener.get_port())
            if port != self._reverse_port:
                self.generation += 1
            self._reverse, self._reverse_on, self._reverse_port = listener, conn, port
        return f"http://127.0.0.1:{self._reverse_port}"

    async def close(self) -> None:
        """Close the forwards and the SSH connection (the process keeps running)."""
        if self._reverse is not None:
            self._reverse.close()
            self._reverse = None
        await self.link.close()
