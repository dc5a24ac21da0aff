"""A gateway on this server's own machine (an instance of a local fleet): the gateway process started, found again,
reached and stopped here, with no SSH.

It is the same program as on an SSH fleet's host (the gateway's zipapp, run by this server's Python under ``-I``),
started detached the way the local backend starts its agents (``local_process``: a session of its own, so it
outlives the server, found again by its pid file). Everything lives in the gateway's directory of the server's state
directory (``gateways/<gateway id>``, mode 0700): the zipapp and its hash, the management token (0600, read by the
process from its file), the state directory, its log, its pid and its management port. The server reaches the
management API on this machine's loopback directly, and the gateway reaches the server on loopback directly (its
``server_url``): there is nothing to forward, so :attr:`LocalGatewayLink.generation` never moves.

The process listens on every address's ports 80 and 443 of this machine (``CORRAL_LOCAL_GATEWAY_HTTP_PORT`` and
``CORRAL_LOCAL_GATEWAY_HTTPS_PORT`` move them, behind a forward from 80 and 443). Before a start the two ports are
tried here: one that is taken, or that this server's user may not bind, is a :class:`LocalGatewayError` naming the
port, never a process left to die.

May import: the standard library, ``backends.local_process`` and ``backends.gateway_link`` (the build and the
deploy's answer, shared with SSH hosts).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import socket
import sys
import time
from pathlib import Path

from corral.backends import local_process
from corral.backends.gateway_link import START_WAIT, ZIPAPP, Deployed, GatewayBuild

#: What a port of this machine that the gateway cannot take says (``{port}``, ``{why}``, ``{setting}``).
PORT_TAKEN = (
    "port {port} of this machine is taken ({why}): another program listens there; stop it, or move the gateway's "
    "port with {setting}"
)
#: Linux lets only root or a process with CAP_NET_BIND_SERVICE bind a port below 1024 (capabilities(7), and
#: ``net.ipv4.ip_unprivileged_port_start``, ip-sysctl.rst of the kernel's documentation).
PORT_DENIED = (
    "port {port} of this machine needs root (or CAP_NET_BIND_SERVICE) to listen on, which this server's user "
    "(uid {uid}) does not have: run the server as root, or move the gateway's port with {setting}"
)


class LocalGatewayError(Exception):
    """The gateway cannot be started or stopped on this machine; ``permanent`` when trying again cannot help."""

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


def port_problem(address: str, port: int, setting: str) -> str | None:
    """Why the gateway could not listen on ``address:port`` of this machine now (None: it can)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's servers bind
        try:
            s.bind((address, port))
        except PermissionError:
            return PORT_DENIED.format(port=port, uid=os.geteuid(), setting=setting)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return PORT_TAKEN.format(port=port, why=e.strerror, setting=setting)
            return f"port {port} of this machine cannot be listened on: {e}"
    return None


class LocalGatewayLink:
    """One gateway on this machine (the same surface as :class:`~corral.backends.gateway_link.GatewayLink`)."""

    generation = 0

    def __init__(self, directory: Path, server_url: str, http_port: int = 80, https_port: int = 443) -> None:
        self.dir = directory
        self._server_url = server_url
        self.ports = {"CORRAL_LOCAL_GATEWAY_HTTP_PORT": http_port, "CORRAL_LOCAL_GATEWAY_HTTPS_PORT": https_port}
        self.management_port = self._read_int("gateway.port")

    @property
    def label(self) -> str:
        return "this server's machine"

    def _read_int(self, name: str) -> int | None:
        try:
            return int((self.dir / name).read_text().strip())
        except (OSError, ValueError):
            return None

    def _write(self, name: str, text: str, mode: int = 0o644) -> None:
        tmp = self.dir / f".{name}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, self.dir / name)

    def _upload(self, build: GatewayBuild) -> bool:
        """The zipapp copied into the gateway's directory when it differs; whether it was."""
        if (self.dir / f"{ZIPAPP}.hash").is_file() and (self.dir / f"{ZIPAPP}.hash").read_text() == build.digest:
            return False
        tmp = self.dir / f".{ZIPAPP}.tmp"
        tmp.write_bytes(build.data)
        os.replace(tmp, self.dir / ZIPAPP)
        self._write(f"{ZIPAPP}.hash", build.digest)
        return True

    def _adoptable(self, token: str, build: str) -> int | None:
        """The pid of a process started with this token and build that answers on its port (None: none)."""
        pid, port = self._read_int("gateway.pid"), self.management_port
        same = (self.dir / "token").is_file() and (self.dir / "token").read_text() == token
        same = same and (self.dir / "build").is_file() and (self.dir / "build").read_text() == build
        if pid is None or port is None or not same or not local_process.alive(pid):
            return None
        return pid if local_process.listening(port) else None

    async def deploy(self, build: GatewayBuild, token: str) -> Deployed:
        """Start the gateway (or adopt the one running with the same token and build)."""
        try:
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            uploaded = self._upload(build)
        except OSError as e:
            raise LocalGatewayError(f"cannot write the gateway's directory {self.dir}: {e}", permanent=True) from None
        http, https = self.ports.values()
        described = f"{build.digest} {http} {https}"
        pid = self._adoptable(token, described)
        if pid is not None and self.management_port is not None:
            return Deployed(self.management_port, pid, adopted=True, uploaded=uploaded)
        await self._stop()
        for setting, port in self.ports.items():
            problem = port_problem("0.0.0.0", port, setting)
            if problem is not None:
                raise LocalGatewayError(problem, permanent=True)
        self._write("token", token, 0o600)
        self._write("build", described)
        return await self._start(uploaded)

    async def _start(self, uploaded: bool) -> Deployed:
        (self.dir / "state").mkdir(mode=0o700, exist_ok=True)
        port = local_process.free_port()
        argv = [
            sys.executable, "-I", str(self.dir / ZIPAPP), "serve", "--state-dir", str(self.dir / "state"),
            "--management", f"127.0.0.1:{port}", "--token-file", str(self.dir / "token"),
            "--http", f"0.0.0.0:{self.ports['CORRAL_LOCAL_GATEWAY_HTTP_PORT']}",
            "--https", f"0.0.0.0:{self.ports['CORRAL_LOCAL_GATEWAY_HTTPS_PORT']}",
        ]  # fmt: skip
        proc = local_process.spawn_detached(argv, self.dir / "gateway.log")
        self._write("gateway.pid", str(proc.pid))
        deadline = time.monotonic() + START_WAIT
        while not local_process.listening(port):
            if proc.poll() is not None:
                why = " ".join(local_process.log_tail(self.dir / "gateway.log", 400).split())
                raise LocalGatewayError(f"the gateway exited with code {proc.returncode}: {why}", permanent=True)
            if time.monotonic() > deadline:
                local_process.kill_group(proc.pid)
                raise LocalGatewayError("the gateway did not start in time")
            await asyncio.sleep(0.05)
        self._write("gateway.port", str(port))
        self.management_port = port
        return Deployed(port, proc.pid, adopted=False, uploaded=uploaded)

    async def _stop(self) -> None:
        pid = self._read_int("gateway.pid")
        if pid is not None and local_process.alive(pid):
            await local_process.stop(pid, 10.0)
        elif pid is not None:  # it died (killed, crashed): its exit collected, if this server started it
            local_process.reap(pid)
        for name in ("gateway.pid", "gateway.port"):
            with contextlib.suppress(FileNotFoundError):
                (self.dir / name).unlink()
        self.management_port = None

    async def remove(self) -> None:
        """Stop the process (ports 80 and 443 closed) and remove the gateway's directory."""
        await self._stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def management_url(self) -> str:
        """``http://127.0.0.1:PORT``: the management API on this machine's loopback (its port as last started)."""
        return f"http://127.0.0.1:{self.management_port or 9}"

    async def server_url(self) -> str:
        """The server's own address on this machine: the gateway reaches it directly."""
        return self._server_url

    async def close(self) -> None:
        """Nothing to close: the process keeps running, and nothing is forwarded."""
