"""Hollow hosts: many simulated SSH hosts, each with a simulated corral agent, in one asyncio process.

The server reaches them exactly as it reaches real hosts of an SSH fleet (``backends/ssh.py``): it logs in
over SSH (one connection per host), runs the bootstrap's commands (``backends/ssh_bootstrap.py``: the
probe, the upload, the start script, the port file, the removal) and then speaks the agent's HTTP protocol
(``agent/server.py``, ``agent/protocol.py``) through a port forwarded over that connection. Here one SSH
listener (asyncssh's server) answers for every host: a host is the loopback address the connection was
made to (``127.64.0.1``, ``127.64.0.2``, ...; all of ``127.0.0.0/8`` is this machine's loopback), so a
fleet lists distinct hosts. The bootstrap's commands are recognised by what they are (the probe's mark,
the upload's ``cat > .agent.pyz.tmp``, the start script's token heredoc, ``cat .../agent.port``, the
removal's ``echo removed=1``) and answered as a host with ``python3`` would; the agent's requests are
parsed and answered with the protocol's own dataclasses (``JobSubmission.from_dict`` validates every
submission as the real agent does), the agent picked by the request's bearer token (the token the start
script wrote on that host).

A job "runs" for a duration drawn from ``--duration`` (seeded by the job's id): it is ``running`` from its
submission, writes a line of output at its start and one at its end, reports a metrics sample on every
logs poll that asks for them, and ends ``done`` with exit status 0 (or ``terminated`` when stopped). The
process keeps its own record of what ran where and when: one line per job, ``(host, job_id, run_name,
start, end, outcome)`` in Unix time; on SIGTERM or SIGINT it writes the record to ``--record`` as JSON and
exits. The benchmark's checks read that record, never the server's rows.

    python benchmarks/benchlib/hollow.py --authorized KEY.pub --record FILE [--cpus 2] [--duration 0.5-3]

It prints ``ready PORT`` once its SSH listener is up.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from corral.known_warnings import install_filters

install_filters()  # asyncssh's import-time DSA notice, as corral's own processes filter it
import asyncssh  # noqa: E402

from corral.agent.protocol import (  # noqa: E402
    AGENT_PROTOCOL_VERSION,
    AGENT_VERSION,
    HostInfo,
    JobState,
    JobSubmission,
    LogEntry,
    LogsReply,
    ProtocolError,
)
from corral.agent.protocol_metrics import MetricsSample  # noqa: E402
from corral.agent.protocol_sandbox import AddressReply  # noqa: E402

#: The port every hollow agent says it listens on (``work/agent.port``); the SSH listener takes forwarded
#: connections to it and hands them to the agent's HTTP handler in this process.
AGENT_PORT = 7070
_TOKEN_RE = re.compile(rb"<<'CORRAL_TOKEN'\n([^\n]*)\n")
_UPLOAD_RE = re.compile(r"echo ([0-9a-f]+) > \S+/agent\.pyz\.hash")
_JOB_RE = re.compile(r"^/jobs/([^/]+)(/logs|/stop|/address)?$")
_BLOB_RE = re.compile(r"^/blobs/([^/]+)$")
MAX_WAIT_S = 30.0


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class HollowJob:
    sub: JobSubmission
    state: JobState
    entries: list[LogEntry]
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    timer: asyncio.TimerHandle | None = None

    def touch(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


@dataclass
class HollowHost:
    address: str
    token: str = ""
    agent_hash: str | None = None
    started: float = 0.0
    jobs: dict[str, HollowJob] = field(default_factory=dict)


@dataclass
class Ran:
    """One line of the record: a job as the host that ran it saw it."""

    host: str
    job_id: str
    run_name: str
    start: float
    end: float | None = None
    outcome: str = "running"


class Hollow:
    """Every hollow host and agent, and the record of what ran where and when."""

    def __init__(self, cpus: int, memory_mib: int, duration: tuple[float, float]) -> None:
        self.cpus = cpus
        self.memory_mib = memory_mib
        self.duration = duration
        self.hosts: dict[str, HollowHost] = {}
        self.by_token: dict[str, HollowHost] = {}
        self.record: dict[tuple[str, str], Ran] = {}
        self.requests = 0

    def host(self, address: str) -> HollowHost:
        h = self.hosts.get(address)
        if h is None:
            h = self.hosts[address] = HollowHost(address)
        return h

    # ---- the SSH side: the bootstrap's commands --------------------------------------------------------
    async def run_command(self, host: HollowHost, command: str, stdin: bytes) -> tuple[bytes, int]:
        """The output and exit status a host with python3 gives the bootstrap's command."""
        if command == "sh -s" and b"corral-probe" in stdin:
            lines = ["corral-probe", "python=/usr/bin/python3", "pyver=3.11", f"home=/home/hollow{host.address}"]
            lines += ["uid=1000", *([f"hash={host.agent_hash}"] if host.agent_hash else [])]
            return ("\n".join(lines) + "\n").encode(), 0
        if "agent.pyz.tmp" in command:
            m = _UPLOAD_RE.search(command)
            host.agent_hash = m.group(1) if m else None
            return b"", 0
        if command == "sh -s" and b"CORRAL_TOKEN" in stdin:
            m = _TOKEN_RE.search(stdin)
            if m is None:
                return b"failed=no token in the start script\n", 0
            token = m.group(1).decode()
            adopted = token == host.token
            if not adopted:
                self.by_token.pop(host.token, None)
                host.token, host.started = token, time.time()
                self.by_token[token] = host
            pid = 10000 + len(self.by_token)
            return f"{'adopted=1' + chr(10) if adopted else ''}port={AGENT_PORT}\npid={pid}\n".encode(), 0
        if command.startswith("cat ") and command.rstrip('"').endswith("work/agent.port"):
            return (f"{AGENT_PORT}\n".encode(), 0) if host.token else (b"", 1)
        if command == "sh -s" and b"echo removed=1" in stdin:
            self.by_token.pop(host.token, None)
            now = time.time()
            for job in host.jobs.values():
                self._finish(host, job, "terminated", None, now, "stopped")
            host.token, host.agent_hash, host.jobs = "", None, {}
            return b"removed=1\n", 0
        return f"hollow host: unknown command {command[:80]!r}\n".encode(), 127

    # ---- the agent's HTTP side -------------------------------------------------------------------------
    async def serve_http(self, reader: Any, writer: Any) -> None:
        """One forwarded connection: HTTP/1.1 requests with keep-alive, as ``agent/server.py`` answers them."""
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncssh.Error, OSError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                length = int(headers.get("content-length") or 0)
                body = await reader.readexactly(length) if length else b""
                status, payload = await self._answer(method, target, headers, body)
                data = json.dumps(payload).encode()
                writer.write(
                    b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                    % (status, len(data))
                    + data
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncssh.Error, OSError, ValueError):
            return
        finally:
            try:
                writer.close()
            except Exception:
                pass

    async def _answer(self, method: str, target: str, headers: dict[str, str], body: bytes) -> tuple[int, Any]:
        self.requests += 1
        url = urlsplit(target)
        scheme, _, token = (headers.get("authorization") or "").partition(" ")
        host = self.by_token.get(token.strip()) if scheme.lower() == "bearer" else None
        if method == "GET" and url.path == "/health" and host is None:
            return 200, {"status": "ok"}
        if host is None:
            return 403, {"error": "a valid 'Authorization: Bearer <token>' header is required"}
        try:
            return await self._route(host, method, url.path, parse_qs(url.query), body)
        except HttpError as e:
            return e.status, {"error": str(e)}
        except (ProtocolError, ValueError) as e:
            return 400, {"error": str(e)}

    async def _route(
        self, host: HollowHost, method: str, path: str, query: dict[str, list[str]], body: bytes
    ) -> tuple[int, Any]:
        if path == "/health":
            uptime = time.time() - host.started
            return 200, {
                "status": "ok",
                "agent_version": AGENT_VERSION,
                "protocol_version": AGENT_PROTOCOL_VERSION,
                "uptime": uptime,
            }
        if path == "/info":
            return 200, self.info(host).to_dict()
        if path == "/jobs" and method == "POST":
            return 200, self.submit(host, JobSubmission.from_dict(json.loads(body))).to_dict()
        if path == "/jobs" and method == "GET":
            return 200, [j.state.to_dict() for j in host.jobs.values()]
        if path == "/shutdown":
            now = time.time()
            for job in host.jobs.values():
                self._finish(host, job, "terminated", None, now, "stopped")
            return 200, {}
        blob = _BLOB_RE.match(path)
        if blob is not None:
            if method == "PUT":
                return 200, {"hash": blob.group(1), "size": len(body)}
            raise HttpError(404, f"blob {blob.group(1)} not found")
        m = _JOB_RE.match(path)
        if m is None:
            raise HttpError(404, f"no such endpoint: {path}")
        job = host.jobs.get(m.group(1))
        if job is None:
            raise HttpError(404, f"job {m.group(1)} not found")
        sub_path = m.group(2)
        if sub_path is None and method == "GET":
            return 200, job.state.to_dict()
        if sub_path is None and method == "DELETE":
            if not job.state.finished:
                raise HttpError(409, f"job {job.sub.job_id} is {job.state.state}; stop it first")
            del host.jobs[job.sub.job_id]
            return 200, {}
        if sub_path == "/logs":
            return 200, (await self.logs(job, query)).to_dict()
        if sub_path == "/address":
            return 200, AddressReply(None).to_dict()
        if sub_path == "/stop":
            data = json.loads(body) if body.strip() else {}
            reason = "aborted" if data.get("abort") else "stopped"
            self._finish(host, job, "terminated", None, time.time(), reason)
            return 200, job.state.to_dict()
        raise HttpError(405, f"method {method} is not allowed on {path}")

    def info(self, host: HollowHost) -> HostInfo:
        return HostInfo(
            hostname=f"hollow-{host.address}",
            cpus=self.cpus,
            memory_mib=self.memory_mib,
            disk_size_mib=100 * 1024,
            cpu_arch="x86",
            agent_version=AGENT_VERSION,
            python_version="3.11.2",
            addresses=[host.address],
        )

    def submit(self, host: HollowHost, sub: JobSubmission) -> JobState:
        existing = host.jobs.get(sub.job_id)
        if existing is not None:
            return existing.state  # idempotent, as the real agent
        now = time.time()
        state = JobState(job_id=sub.job_id, state="running", started_at=now, pid=20000 + len(self.record) % 30000)
        line = f"hollow {sub.run_name} on {host.address}\n".encode()
        job = HollowJob(sub, state, [LogEntry(now, "stdout", line)])
        host.jobs[sub.job_id] = job
        self.record[(host.address, sub.job_id)] = Ran(host.address, sub.job_id, sub.run_name, now)
        lo, hi = self.duration
        draw = int.from_bytes(hashlib.sha256(sub.job_id.encode()).digest()[:4], "big") / 2**32
        job.timer = asyncio.get_running_loop().call_later(
            lo + (hi - lo) * draw, lambda: self._finish(host, job, "done", 0, time.time(), None)
        )
        return state

    def _finish(
        self, host: HollowHost, job: HollowJob, state: str, exit_status: int | None, now: float, reason: str | None
    ) -> None:
        if job.state.finished:
            return
        if job.timer is not None:
            job.timer.cancel()
        job.entries.append(LogEntry(now, "stdout", b"ok\n" if state == "done" else b"stopped\n"))
        job.state = JobState(
            job_id=job.sub.job_id,
            state=state,
            exit_status=exit_status,
            started_at=job.state.started_at,
            finished_at=now,
            pid=job.state.pid,
            termination_reason=reason,
        )
        ran = self.record.get((host.address, job.sub.job_id))
        if ran is not None:
            ran.end, ran.outcome = now, state
        job.touch()

    async def logs(self, job: HollowJob, query: dict[str, list[str]]) -> LogsReply:
        offset = int(query.get("offset", ["0"])[-1])
        limit = int(query.get("limit", ["1000"])[-1])
        wait = min(max(float(query.get("wait", ["0"])[-1]), 0.0), MAX_WAIT_S)
        known = query.get("state", [None])[-1]
        stale = known is not None and job.state.state != known
        if len(job.entries) <= offset and not job.state.finished and not stale and wait > 0:
            try:
                await asyncio.wait_for(job.changed.wait(), wait)
            except asyncio.TimeoutError:
                pass
        entries = job.entries[offset : offset + limit]
        reply = LogsReply(entries=entries, next_offset=offset + len(entries), state=job.state)
        if query.get("metrics_after"):
            now = int(time.time() * 1e6)
            used = now - int((job.state.started_at or time.time()) * 1e6)
            reply.metrics = [MetricsSample(now, max(0, used // 2), 64 << 20, 48 << 20)]
        return reply

    def dump(self) -> list[dict[str, Any]]:
        return [r.__dict__ for r in self.record.values()]


class _SshServer(asyncssh.SSHServer):
    def __init__(self, hollow: Hollow) -> None:
        self.hollow = hollow
        self.host: HollowHost | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        sockname = conn.get_extra_info("sockname")
        peer = conn.get_extra_info("peername")
        if not str(peer[0]).startswith("127."):  # only this machine may log in to its hollow hosts
            conn.close()
            return
        self.host = self.hollow.host(str(sockname[0]))
        conn.set_extra_info(hollow_host=self.host)

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int) -> Any:
        if dest_port != AGENT_PORT or self.host is None or not self.host.token:
            return False  # nothing listens there: the tunnel's open fails as on a host without its agent
        return self.hollow.serve_http


async def _process(hollow: Hollow, process: asyncssh.SSHServerProcess[bytes]) -> None:
    host = process.get_extra_info("hollow_host")
    command = process.command or ""
    stdin = await process.stdin.read() if command == "sh -s" or "agent.pyz.tmp" in command else b""
    out, status = await hollow.run_command(host, command, stdin)
    process.stdout.write(out)
    process.exit(status)


async def serve(args: argparse.Namespace) -> None:
    lo, _, hi = args.duration.partition("-")
    hollow = Hollow(args.cpus, args.memory_mib, (float(lo), float(hi or lo)))
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    server = await asyncssh.listen(
        "0.0.0.0",
        args.port,
        server_host_keys=[host_key],
        authorized_client_keys=args.authorized,
        server_factory=lambda: _SshServer(hollow),
        process_factory=lambda p: _process(hollow, p),
        encoding=None,
        allow_scp=False,
        agent_forwarding=False,
        x11_forwarding=False,
        keepalive_interval=0,
        login_timeout=60,
    )
    port = server.sockets[0].getsockname()[1]
    print(f"ready {port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    tmp = f"{args.record}.tmp"
    with open(tmp, "w") as f:
        json.dump({"hosts": len(hollow.hosts), "requests": hollow.requests, "ran": hollow.dump()}, f)
    os.replace(tmp, args.record)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--authorized", required=True, help="the public key the server logs in with (a file)")
    p.add_argument("--record", required=True, help="where to write the record (JSON) on SIGTERM")
    p.add_argument("--port", type=int, default=0, help="the SSH listener's port (0: any free one)")
    p.add_argument("--cpus", type=int, default=2, help="CPUs each hollow host reports")
    p.add_argument("--memory-mib", type=int, default=8192, help="memory each hollow host reports")
    p.add_argument("--duration", default="0.5-3", help="seconds a job runs, drawn uniformly from LO-HI")
    args = p.parse_args()
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
