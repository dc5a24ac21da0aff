#!/usr/bin/env python3
"""Server memory (RSS) before and after large request bodies: anonymous and authenticated, declared
(``Content-Length``) and streamed (chunked), to ``/api/runs/list`` (a global list route).

Starts `corral server` as a process on a free loopback port with a fresh state directory, reads its RSS
(and its peak, ``VmHWM``) from ``/proc``, sends each body as fast as the server takes it (for at most
30 s; the server may answer and close early), and reads the RSS again. Also prints how much of each
body the client got to send before the server answered. Figures, not assertions.

    python benchmarks/big_body.py [--mb 200]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int, key: str = "VmRSS") -> float:
    """The process's resident memory now (``VmRSS``) or at its peak so far (``VmHWM``), in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {key}")


def start_server(state: str, port: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "CORRAL_SERVER_DIR": state,
        "CORRAL_CONFIG_DIR": f"{state}/cli",
        "CORRAL_SERVER_ADMIN_TOKEN": "bench",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral.cli.main", "server", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.post(f"http://127.0.0.1:{port}/api/server/get_info", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the server did not start")


def send(port: int, size: int, token: str | None, chunked: bool) -> tuple[str, int, float]:
    """Send ``size`` bytes of ``[`` as a body: (status line or error, bytes the server took, seconds)."""
    head = ["POST /api/runs/list HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json"]
    if token:
        head.append(f"Authorization: Bearer {token}")
    head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}")
    chunk = b"[" * 2**20
    sent = 0
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        s.settimeout(30)
        try:
            while sent < size and time.monotonic() - started < 30:
                data = b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk
                s.sendall(data)
                sent += len(chunk)
            if chunked:
                s.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the server answered and closed: what it took is what was sent before
        try:
            status = s.recv(4096).split(b"\r\n", 1)[0].decode() or "closed"
        except OSError as e:
            status = type(e).__name__
    return status, sent, time.monotonic() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=200, help="body size in MiB")
    args = ap.parse_args()
    size = args.mb * 2**20
    with tempfile.TemporaryDirectory() as state:
        port = free_port()
        proc = start_server(state, port)
        try:
            httpx.post(f"http://127.0.0.1:{port}/api/runs/list", json={}, headers={"Authorization": "Bearer bench"})
            print(f"idle server: RSS {rss_mib(proc.pid):.1f} MiB")
            for token, chunked in ((None, False), (None, True), ("bench", False), ("bench", True)):
                before = rss_mib(proc.pid)
                status, sent, took = send(port, size, token, chunked)
                time.sleep(0.5)
                after = rss_mib(proc.pid)
                who = "with token" if token else "anonymous"
                how = "chunked" if chunked else "Content-Length"
                print(
                    f"{args.mb} MiB {who:10} {how:14}: {status!r:36} after sending {sent / 2**20:7.1f} MiB "
                    f"in {took:5.2f} s; RSS {before:.1f} -> {after:.1f} MiB, peak {rss_mib(proc.pid, 'VmHWM'):.1f} MiB"
                )
        finally:
            proc.terminate()
            proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
