"""The gateway process for tests, started for real from its zipapp under ``python3 -I``, and what it talks to.

* :class:`PrivateCA`: a certificate authority of the test's own (``cryptography``), issuing per-host certificates.
* :class:`StandIn`: a tiny real HTTP server in the test playing the corral server's part: it answers the token
  check ``POST /api/projects/<p>/get`` (``Bearer good`` is allowed, ``Bearer slow`` refused after 0.5 s) and,
  under ``/proxy/...``, echoes what it received as JSON, streams server-sent events on ``.../sse`` (one event,
  then the next only once the test says), sends a 103 before its answer on ``.../early``, echoes websocket bytes
  on ``.../ws`` after a 101, sends a 101 unasked on ``.../rogue-upgrade``, and answers ``.../slow`` after 5 s.
* :class:`GatewayProc`: the process, on loopback ports (no root) or in a network namespace of its own (its own
  address with its own :80 and :443); ``mgmt`` calls its management API.
"""

from __future__ import annotations

import contextlib
import datetime
import http.client
import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from corral.gateway.zipapp import build_zipapp

TOKEN = "test-management-token"
GOOD = "Bearer good"
SLOW = "Bearer slow"  # refused, after 0.5 s


def base_python() -> str:
    """An interpreter outside the dev virtualenv (no corral, pydantic or httpx importable under -I)."""
    return str(getattr(sys, "_base_executable", None) or shutil.which("python3") or sys.executable)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateCA:
    """A private CA; :meth:`issue` makes a leaf certificate for a host, returned as (fullchain PEM, key PEM)."""

    def __init__(self, directory: Path) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "corral gateway test CA")])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.path = directory / "test-ca.pem"
        self.path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, host: str, days: int = 90) -> tuple[str, str, datetime.datetime]:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
        not_after = now + datetime.timedelta(days=days)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        chain = cert.public_bytes(serialization.Encoding.PEM) + self.cert.public_bytes(serialization.Encoding.PEM)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return chain.decode(), key_pem.decode(), not_after


class StandIn:
    """The corral server's part, on ``address`` (a real HTTP/1.1 server in threads)."""

    def __init__(self, address: str = "127.0.0.1") -> None:
        self.token_checks: list[tuple[str, str]] = []
        self.requests: list[dict[str, Any]] = []
        self.next_event = threading.Event()
        self.connections: list[socket.socket] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                stand_in.connections.append(self.connection)

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                stand_in.handle(self)

            do_POST = do_PUT = do_DELETE = do_GET

        self.httpd = ThreadingHTTPServer((address, 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://{address}:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def drop_connections(self) -> None:
        """Close every connection from the server's side (as a server does with idle kept-alive ones)."""
        for conn in self.connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self.connections.clear()

    def close(self) -> None:
        self.next_event.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _body(self, h: BaseHTTPRequestHandler) -> bytes:
        if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(h.rfile.readline().split(b";")[0], 16)
                data = h.rfile.read(size + 2)[:-2]
                if not size:
                    return out
                out += data
        return h.rfile.read(int(h.headers.get("Content-Length") or 0))

    def _send(self, h: BaseHTTPRequestHandler, status: int, body: bytes, ctype: str = "application/json") -> None:
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        if h.path.startswith("/api/projects/") and h.path.endswith("/get") and h.command == "POST":
            project = h.path.split("/")[3]
            self._body(h)
            self.token_checks.append((project, h.headers.get("Authorization", "")))
            if h.headers.get("Authorization") == SLOW:
                time.sleep(0.5)
            ok = h.headers.get("Authorization") == GOOD
            self._send(h, 200 if ok else 403, b'{"project_name": "%s"}' % project.encode() if ok else b"{}")
            return
        body = self._body(h)
        seen = {
            "method": h.command,
            "path": h.path,
            "headers": dict(h.headers.items()),
            "body": body.decode(),
            "peer": list(h.client_address),
        }
        self.requests.append(seen)
        if h.path.endswith("/sse"):
            self._sse(h)
        elif h.path.endswith("/ws"):
            self._websocket(h)
        elif h.path.endswith("/rogue-upgrade"):  # a 101 nobody asked for
            h.send_response(101)
            h.end_headers()
            h.close_connection = True
        elif h.path.endswith("/early"):  # an interim answer first (103 Early Hints), then the answer
            h.wfile.write(b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n")
            self._send(h, 200, b"after hints")
        elif h.path.endswith("/held"):  # as the server answers a request it held at zero replicas and counted
            h.send_response(200)
            h.send_header("X-Corral-Counted", "1")
            h.send_header("Content-Length", "4")
            h.end_headers()
            h.wfile.write(b"held")
        elif h.path.endswith("/slow"):
            time.sleep(5)
            self._send(h, 200, b"late")
        else:
            self._send(h, 200, json.dumps(seen).encode())

    def _sse(self, h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        for i, event in enumerate((b"data: one\n\n", b"data: two\n\n")):
            if i:
                self.next_event.wait(10)
            h.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            h.wfile.flush()
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()

    def _websocket(self, h: BaseHTTPRequestHandler) -> None:
        h.send_response(101)
        h.send_header("Upgrade", "websocket")
        h.send_header("Connection", "Upgrade")
        h.end_headers()
        h.wfile.flush()
        while True:  # echo, upper-cased, until the client closes
            data = h.connection.recv(65536)
            if not data:
                break
            h.connection.sendall(data.upper())
        h.close_connection = True


class GatewayProc:
    """The gateway process; ``prefix`` runs it inside a namespace (``ip netns exec NS``)."""

    def __init__(
        self,
        directory: Path,
        http: str,
        https: str,
        management: str,
        prefix: Sequence[str] = (),
        mgmt_via: tuple[str, int] | None = None,
        python: str | None = None,
    ) -> None:
        self.directory = directory
        self.python = python or base_python()
        self.http, self.https, self.management = http, https, management
        self.prefix = list(prefix)
        directory.mkdir(parents=True, exist_ok=True)
        self.pyz = build_zipapp(directory / "corral-gateway.pyz")
        (directory / "token").write_text(TOKEN + "\n")
        self.log = directory / "gateway.log"
        self.proc: subprocess.Popen[bytes] | None = None
        host, port = management.rsplit(":", 1)
        self.mgmt_address = mgmt_via or (host, int(port))

    def argv(self) -> list[str]:
        return [
            *self.prefix,
            self.python,
            "-I",
            str(self.pyz),
            "serve",
            "--state-dir",
            str(self.directory / "state"),
            "--management",
            self.management,
            "--token-file",
            str(self.directory / "token"),
            "--http",
            self.http,
            "--https",
            self.https,
        ]

    def start(self) -> GatewayProc:
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=err, stderr=err)
        deadline = time.monotonic() + 15
        while True:
            with contextlib.suppress(OSError, http.client.HTTPException):
                if self.mgmt("GET", "/api/health")[0] == 200:
                    return self
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not start: {self.log.read_text()}")
            time.sleep(0.05)

    def stop(self, timeout: float = 15) -> int:
        """SIGTERM, and its exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def mgmt(self, method: str, path: str, body: Any = None, token: str | None = TOKEN) -> tuple[int, Any]:
        conn = http.client.HTTPConnection(*self.mgmt_address, timeout=10)
        try:
            headers = {"Content-Type": "application/json"}
            if token is not None:
                headers["Authorization"] = f"Bearer {token}"
            data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
        finally:
            conn.close()

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, value = self.mgmt(method, path, body)
        assert status == 200, (status, value)
        return value


def service_body(host: str, https: bool = True, auth: bool = False, **extra: Any) -> dict[str, Any]:
    return {"host": host, "https": https, "auth": auth, "upstream_path": "/proxy/services/p/r/", **extra}


#: A TCP relay run inside the gateway's namespace, so that the test reaches the loopback-only management API.
RELAY = """
import asyncio, sys
listen_host, listen_port, to_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
async def pipe(r, w):
    try:
        while True:
            data = await r.read(65536)
            if not data:
                break
            w.write(data)
            await w.drain()
    finally:
        w.close()
async def handle(r, w):
    ur, uw = await asyncio.open_connection("127.0.0.1", to_port)
    await asyncio.gather(pipe(r, uw), pipe(ur, w), return_exceptions=True)
async def main():
    server = await asyncio.start_server(handle, listen_host, listen_port)
    async with server:
        await server.serve_forever()
asyncio.run(main())
"""


def start_relay(netns: str, listen_host: str, listen_port: int, to_port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        ["ip", "netns", "exec", netns, base_python(), "-I", "-c", RELAY, listen_host, str(listen_port), str(to_port)],
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            socket.create_connection((listen_host, listen_port), timeout=0.5).close()
            return proc
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the management relay did not start")
