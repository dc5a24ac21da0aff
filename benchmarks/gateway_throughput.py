#!/usr/bin/env python3
"""The gateway process's throughput and latency beside a direct request to the same upstream (and beside nginx
as a reverse proxy, when ``nginx`` is on PATH or given with ``--nginx``; Debian's binary works unpacked anywhere:
``apt-get download nginx && dpkg -x nginx_*.deb DIR``, then ``--nginx DIR/usr/sbin/nginx``).

Starts a tiny asyncio HTTP/1.1 app answering ``ok`` to everything (it plays the corral server: the token check
and the service proxy) and the gateway zipapp on loopback ports in front of it, with three services: plain HTTP,
plain HTTP with ``auth: true`` (the token answer cached after the first request), and HTTPS (a certificate of a
throwaway CA). A load client in a second process sends GET requests over keep-alive connections (and, for
``https-new``, one TLS connection per request) and prints requests per second and p50/p99 latency at
concurrency 1 and 16. Figures, not assertions.

    python benchmarks/gateway_throughput.py [--requests 3000] [--nginx PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

APP = """
import asyncio
BODY = b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\nContent-Type: text/plain\\r\\n\\r\\nok"
async def serve(r, w):
    try:
        while True:
            head = await r.readuntil(b"\\r\\n\\r\\n")
            w.write(BODY)
            if b"connection: close" in head.lower():
                await w.drain()
                break
    except Exception:
        pass
    w.close()
async def main():
    s = await asyncio.start_server(serve, "127.0.0.1", int(__import__("sys").argv[1]), backlog=1024)
    await s.serve_forever()
asyncio.run(main())
"""

NGINX = """
daemon off; pid {d}/nginx.pid; worker_processes 1;
events {{ worker_connections 1024; }}
http {{ access_log off; keepalive_requests 1000000;
  client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d}; uwsgi_temp_path {d}; scgi_temp_path {d};
  upstream app {{ server 127.0.0.1:{upstream}; keepalive 32; }}
  server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://app; proxy_http_version 1.1;
    proxy_set_header Connection ""; proxy_set_header Host $host; proxy_set_header X-Real-IP $remote_addr; }} }}
  server {{ listen 127.0.0.1:{tls_port} ssl; ssl_certificate {d}/tls.crt; ssl_certificate_key {d}/tls.key;
    location / {{ proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_set_header Host $host; proxy_set_header X-Real-IP $remote_addr; }} }}
}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


# ---- the load client (a second process) ---------------------------------------------------------
async def _worker(port: int, host: str, tls: ssl.SSLContext | None, fresh: bool, n: int, out: list[float]) -> None:
    head = f"GET /bench HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer bench\r\n\r\n".encode()
    conn = None
    for _ in range(n):
        t0 = time.perf_counter()
        if conn is None:
            conn = await asyncio.open_connection("127.0.0.1", port, ssl=tls, server_hostname=host if tls else None)
        reader, writer = conn
        writer.write(head)
        raw = await reader.readuntil(b"\r\n\r\n")
        if not raw.startswith(b"HTTP/1.1 200"):
            raise SystemExit(raw.decode(errors="replace"))
        length = next(
            int(line.split(b":")[1]) for line in raw.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        if fresh:
            writer.close()
            conn = None
        out.append(time.perf_counter() - t0)
    if conn is not None:
        conn[1].close()


async def _load(port: int, host: str, cafile: str, fresh: bool, requests: int, concurrency: int) -> dict[str, float]:
    tls = ssl.create_default_context(cafile=cafile) if cafile else None
    await _worker(port, host, tls, fresh, 100, [])
    lat: list[float] = []
    t0 = time.perf_counter()
    per = requests // concurrency
    await asyncio.gather(*(_worker(port, host, tls, fresh, per, lat) for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"rps": len(lat) / wall, "p50_ms": statistics.median(lat) * 1000, "p99_ms": pct(lat, 0.99) * 1000}


def run_client(port: int, host: str, cafile: str, fresh: bool, requests: int, concurrency: int) -> dict[str, float]:
    argv = [sys.executable, __file__, "--client", str(port), host, cafile, str(int(fresh)), str(requests)]
    out = subprocess.run([*argv, str(concurrency)], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"the load client failed on port {port} ({host}): {out.stderr.strip()[-2000:]}")
    return dict(json.loads(out.stdout))


# ---- the set-up (this process) --------------------------------------------------------------------
def _certificate(d: Path, host: str) -> tuple[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(2)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (d / "ca.pem").write_bytes(ca.public_bytes(pem))
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    chain = (leaf.public_bytes(pem) + ca.public_bytes(pem)).decode()
    (d / "tls.crt").write_text(chain)
    (d / "tls.key").write_text(key_pem)
    return chain, key_pem


def _mgmt(port: int, method: str, path: str, body: object) -> None:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        method=method,
        headers={"Authorization": "Bearer bench-token", "Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=10).read()


def _wait(port: int) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


def bench(requests: int, nginx: str | None) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from corral.gateway.zipapp import build_zipapp

    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="corral-gw-bench-") as tmp:
        d = Path(tmp)
        upstream, http, https, mgmt = free_port(), free_port(), free_port(), free_port()
        procs.append(subprocess.Popen([sys.executable, "-c", APP, str(upstream)]))
        pyz = build_zipapp(d / "corral-gateway.pyz")
        (d / "token").write_text("bench-token\n")
        python3 = shutil.which("python3") or sys.executable
        argv = [python3, "-I", str(pyz), "serve", "--state-dir", str(d / "state"), "--token-file", str(d / "token")]
        argv += ["--management", f"127.0.0.1:{mgmt}", "--http", f"127.0.0.1:{http}", "--https", f"127.0.0.1:{https}"]
        procs.append(subprocess.Popen(argv, stderr=subprocess.DEVNULL))
        for port in (upstream, mgmt):
            _wait(port)
        chain, key = _certificate(d, "tls.bench")
        _mgmt(mgmt, "PUT", "/api/config", {"server_url": f"http://127.0.0.1:{upstream}", "secret": "s"})
        for run, https_on, auth in (("plain", False, False), ("auth", False, True), ("tls", True, False)):
            body = {
                "host": f"{run}.bench",
                "https": https_on,
                "auth": auth,
                "upstream_path": f"/proxy/services/p/{run}/",
            }
            _mgmt(mgmt, "PUT", f"/api/services/p/{run}", body)
        _mgmt(mgmt, "PUT", "/api/certificates/tls.bench", {"fullchain_pem": chain, "key_pem": key})
        cases = [
            ("direct", upstream, "plain.bench", "", False),
            ("gateway http", http, "plain.bench", "", False),
            ("gateway http, auth (cached)", http, "auth.bench", "", False),
            ("gateway https", https, "tls.bench", str(d / "ca.pem"), False),
            ("gateway https, new TLS connection each", https, "tls.bench", str(d / "ca.pem"), True),
        ]
        nginx = nginx or shutil.which("nginx")
        if nginx:
            nport, ntls = free_port(), free_port()
            (d / "nginx.conf").write_text(NGINX.format(d=d, port=nport, tls_port=ntls, upstream=upstream))
            nginx_argv = [nginx, "-p", str(d), "-e", str(d / "nginx-error.log"), "-c", str(d / "nginx.conf")]
            procs.append(subprocess.Popen(nginx_argv, stderr=subprocess.DEVNULL))
            _wait(nport)
            cases += [
                ("nginx http", nport, "plain.bench", "", False),
                ("nginx https", ntls, "tls.bench", str(d / "ca.pem"), False),
                ("nginx https, new TLS connection each", ntls, "tls.bench", str(d / "ca.pem"), True),
            ]
        try:
            print(f"{'path':42} {'rps@1':>8} {'p50ms@1':>8} {'p99ms@1':>8} {'rps@16':>8} {'p50ms@16':>9}")
            for name, port, host, cafile, fresh in cases:
                n = requests // 5 if fresh else requests
                one = run_client(port, host, cafile, fresh, n, 1)
                many = run_client(port, host, cafile, fresh, n, 16)
                row = f"{one['rps']:8.0f} {one['p50_ms']:8.2f} {one['p99_ms']:8.2f} "
                print(f"{name:42} {row}{many['rps']:8.0f} {many['p50_ms']:9.2f}", flush=True)
        finally:
            for p in procs:
                p.terminate()
                p.wait(timeout=15)
    print(f"load average: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        port, host, cafile, fresh, n, c = sys.argv[2:8]
        print(json.dumps(asyncio.run(_load(int(port), host, cafile, fresh == "1", int(n), int(c)))))
    else:
        parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("--requests", type=int, default=3000)
        parser.add_argument("--nginx", help="an nginx binary to compare with (default: nginx on PATH, if any)")
        args = parser.parse_args()
        bench(args.requests, args.nginx)
