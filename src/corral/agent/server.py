"""The agent's HTTP API (``http.server.ThreadingHTTPServer``, JSON in and out).

Bound to 127.0.0.1 unless told otherwise. Every request except ``GET /health`` needs
``Authorization: Bearer <token>`` (constant-time compare), else 403 with ``Connection: close`` (the body,
if any, is never read). Errors are JSON ``{"error": "..."}`` with 400 (bad JSON or fields), 403, 404,
409; an unexpected exception is logged here and answered with a 500 that carries no traceback.

Connections are bounded: a connection idle for ``idle_timeout`` seconds between (or within) requests is
closed (a long poll in progress is the agent's own wait, never cut by it), and at most ``max_connections``
are served at once; one more waits up to a second for a free slot, then gets a 503 and is closed.

    GET    /health                       {"status": "ok"}; with the token also "agent_version",
                                         "protocol_version" and "uptime"
    GET    /info                         HostInfo
    POST   /jobs                         JobSubmission -> JobState (idempotent on job_id)
    GET    /jobs                         [JobState]
    GET    /jobs/{id}                    JobState
    GET    /jobs/{id}/logs?offset&limit&wait&state&metrics_after&acked   LogsReply (long-poll up to ``wait``
                                         <= 30 s; ends early on a state change, at once if the job is no longer
                                         ``state``); with ``metrics_after`` also the job's resource samples
                                         taken after it (:mod:`corral.agent.metrics`); with ``acked=1`` the
                                         entries before ``offset`` are stored by the server and leave the disk
    POST   /jobs/{id}/stop               {"abort": bool, "deadline"?: unix time, "message"?: str} -> JobState
                                         (a deadline: written to the job's CORRAL_PREEMPTION_FILE, then
                                         SIGTERM, SIGKILL at the deadline)
    POST   /jobs/{id}/address            {} -> AddressReply (the job's sandbox address, reserved before
                                         it is submitted so that every node of a run knows every other's)
    DELETE /jobs/{id}                    {} (a finished job only; 409 otherwise)
    POST   /jobs/{id}/exec               ExecRequest, ``Upgrade: corral-session`` -> 101, then the session's
                                         frames (:mod:`corral.agent.protocol_session`); 409 if not running
    POST   /jobs/{id}/connect            {"port"}, ``Upgrade: corral-session`` -> 101, then the raw bytes of a
                                         connection to that port of the job
    GET    /blobs/{sha256}               {"hash", "size"} or 404
    PUT    /blobs/{sha256}               raw body (Content-Length required; must hash to sha256) -> {"hash", "size"}
    POST   /shutdown                     {} ; stops all jobs, then the process exits
"""

from __future__ import annotations

import hmac
import http.client
import json
import logging
import os
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from . import gpus, metrics, resources, sandbox
from .http_head import read_head
from .job import Job, JobConflict, JobNotFound, Notice
from .jobs import JobRunner
from .protocol import AGENT_PROTOCOL_VERSION, AGENT_VERSION, HostInfo, JobSubmission, ProtocolError
from .protocol_sandbox import AddressReply
from .protocol_session import UPGRADE, ExecRequest, parse_connect

log = logging.getLogger("corral.agent")

MAX_BODY = 16 * 1024 * 1024
#: A blob is streamed to disk, never held in memory; this only bounds a runaway upload.
MAX_BLOB = 16 * 1024**3
#: Seconds a connection may stay silent (between requests, or within one) before the agent closes it.
IDLE_TIMEOUT = 120.0
#: Connections (handler threads) served at once.
MAX_CONNECTIONS = 128
_JOB_RE = re.compile(r"^/jobs/([^/]+)(/logs|/stop|/address)?$")
_BLOB_RE = re.compile(r"^/blobs/([^/]+)$")
_SESSION_RE = re.compile(r"^/jobs/([^/]+)/(exec|connect)$")


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Agent:
    """The job runner, host facts and lifecycle behind the HTTP server."""

    def __init__(
        self,
        work_dir: str,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        docker_host: str | None = None,
        sandbox_config: sandbox.SandboxConfig | None = None,
        gpus: tuple[int, ...] | None = None,
        idle_timeout: float = IDLE_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
        metrics_interval: float = metrics.DEFAULT_INTERVAL,
    ) -> None:
        if not token:
            raise ValueError("the token must not be empty")
        self.work_dir = os.path.abspath(work_dir)
        self.token = token.encode()
        self.docker_host = docker_host
        self._runtime: str | None = None
        self._runtime_ready = threading.Event()
        self._info: HostInfo | None = None
        #: The host GPUs (indexes) this agent is restricted to (None: all of them), and those found.
        self.gpus = gpus
        self._gpu_indexes: list[int] = []
        self._info_lock = threading.Lock()
        self.sandboxes = sandbox.Sandboxes(self.work_dir, sandbox_config or sandbox.SandboxConfig(mode="off"))
        self.runner = JobRunner(self.work_dir, self.container_runtime, docker_host, self.nvidia_gpu_ids, self.sandboxes)
        #: Samples running jobs once serving starts (:mod:`corral.agent.metrics`).
        self.sampler = metrics.Sampler(
            self.runner.running, self._root_pid, self._job_gpus, metrics_interval, overhead=_sandbox_pids
        )
        self.runner.on_forget = self.sampler.forget
        self._container_pids: dict[str, int] = {}
        self.httpd = _BoundedServer((host, port), _Handler, max_connections, idle_timeout)
        self.httpd.agent = self  # type: ignore[attr-defined]
        self._shutting_down = threading.Lock()
        self.started = time.time()
        t = threading.Thread(target=self._detect_runtime, name="detect-runtime")
        t.daemon = True
        t.start()

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def _detect_runtime(self) -> None:
        try:
            self._runtime = resources.container_runtime(self.docker_host)
        finally:
            self._runtime_ready.set()
        try:
            self.info()  # warm the cache so the first GET /info is fast
        except Exception:
            log.exception("host detection failed")

    def container_runtime(self) -> str | None:
        self._runtime_ready.wait(10)
        return self._runtime

    def nvidia_gpu_ids(self) -> list[str]:
        """Device ids (``nvidia-smi`` indexes) of this host's NVIDIA GPUs, for containers' device requests."""
        info = self.info()
        return [str(i) for n, i in enumerate(self._gpu_indexes) if info.gpus[n].vendor == "nvidia"]

    def _root_pid(self, job: Job) -> int | None:
        """The pid whose cgroup (or process tree) is the job's: its main process, or its container's."""
        container = job.state.container
        if container is None:
            return job.state.pid
        pid = self._container_pids.get(container.id)
        if pid is None:
            try:
                found = self.runner.containers.docker.inspect(container.id) or {}
            except Exception:  # the engine is away: no sample this time
                return None
            found_pid = (found.get("State") or {}).get("Pid")
            if not isinstance(found_pid, int) or found_pid <= 0:
                return None
            pid = found_pid
            self._container_pids[container.id] = pid
        return pid

    def _job_gpus(self, job: Job) -> tuple[list[int], str]:
        """The host GPU indexes a job was given and their vendor: a container's device requests, or all of
        this agent's GPUs for a host-process job (what it sees)."""
        info = self.info()
        if not info.gpus:
            return [], ""
        container = job.state.container
        if container is not None:
            return [int(i) for i in container.gpu_ids if str(i).isdigit()], "nvidia"
        return list(self._gpu_indexes), info.gpus[0].vendor

    def admit(self, sub: JobSubmission) -> JobSubmission:
        """A submission as a restricted agent runs it: a host process sees only this agent's GPUs, a
        container asking for all of the host's gets all of this agent's."""
        if self.gpus is None:
            return sub
        info = self.info()
        if not sub.image:
            sub.env.update(gpus.visible_devices_env(self._gpu_indexes, [g.vendor for g in info.gpus]))
        elif sub.container is not None and sub.container.gpus == -1:
            sub.container.gpus = len(self.nvidia_gpu_ids())
        return sub

    def info(self) -> HostInfo:
        with self._info_lock:
            if self._info is None:
                detected = resources.detect_host_info(self.work_dir, self.container_runtime())
                self._info, self._gpu_indexes = gpus.restrict(detected, self.gpus)
            return self._info

    def serve_forever(self) -> None:
        self.sampler.start()
        try:
            self.httpd.serve_forever(poll_interval=0.2)
        finally:
            self.httpd.server_close()

    def request_shutdown(self) -> None:
        """Stop all jobs and the server, from any thread (never blocks the caller)."""
        if not self._shutting_down.acquire(blocking=False):
            return

        def run() -> None:
            log.info("shutting down: stopping jobs")
            try:
                self.runner.shutdown()
            finally:
                self.httpd.shutdown()

        t = threading.Thread(target=run, name="shutdown")
        t.daemon = True
        t.start()


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` at once, each idle for ``idle_timeout`` at most."""

    daemon_threads = True
    _BUSY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"

    def __init__(self, address: tuple[str, int], handler: Any, max_connections: int, idle_timeout: float) -> None:
        # the listen backlog (socketserver's default is 5): connections made together -- the server's checks,
        # submissions and long polls of one host -- wait to be accepted instead of having their SYN dropped
        # and retried a second later
        self.request_queue_size = max(max_connections, 5)
        super().__init__(address, handler)
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(timeout=1.0):
            self._refuse_busy(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def _refuse_busy(self, request: Any) -> None:
        body = json.dumps({"error": f"the agent is serving {self.max_connections} connections; retry"}).encode()
        try:
            request.settimeout(1.0)
            request.sendall(self._BUSY + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        except OSError:
            pass
        finally:
            self.shutdown_request(request)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "corral-agent"
    # TCP_NODELAY: head and body are two writes, and Nagle held the body for the client's delayed ACK (40 ms)
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        # every read and write may wait this long; between requests the standard library's
        # handle_one_request closes a connection that times out, within one _dispatch does
        self.connection.settimeout(self.server.idle_timeout)  # type: ignore[attr-defined]

    def parse_request(self) -> bool:
        """An ``HTTP/1.1`` request's line read here and its head by :func:`read_head` (the standard
        library's parse goes through the email package: most of a small request's CPU); any other request line
        is the standard library's to parse or refuse."""
        raw: bytes = self.raw_requestline  # type: ignore[attr-defined]  # set by handle_one_request
        line = str(raw, "iso-8859-1").rstrip("\r\n")
        words = line.split()
        if len(words) != 3 or words[2] != "HTTP/1.1":
            return super().parse_request()
        self.requestline, self.request_version, self.close_connection = line, words[2], False
        self.command, self.path = words[0], words[1]
        if self.path.startswith("//"):  # as the standard library: never a scheme-less absolute URI
            self.path = "/" + self.path.lstrip("/")
        try:
            head = read_head(self.rfile)
        except http.client.LineTooLong as err:
            self.send_error(431, "Line too long", str(err))
            return False
        except http.client.HTTPException as err:
            self.send_error(431, "Too many headers", str(err))
            return False
        self.headers = head  # type: ignore[assignment]  # what the handler reads of it: get()
        connection = (head.get("Connection") or "").lower()
        if connection == "close":
            self.close_connection = True
        if (head.get("Expect") or "").lower() == "100-continue":
            return self.handle_expect_100()
        return True

    def version_string(self) -> str:
        return self.server_version  # no version of the agent or of Python to anyone who asks

    @property
    def agent(self) -> Agent:
        return self.server.agent  # type: ignore[attr-defined,no-any-return]

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def _dispatch(self, method: str) -> None:
        try:
            url = urlsplit(self.path)
            if method == "GET" and url.path == "/health":
                self.authorized = self._has_token()
            else:
                self._authorize()
            blob = _BLOB_RE.match(url.path)
            session = _SESSION_RE.match(url.path) if method == "POST" else None
            if session is not None:
                self._session(session.group(1), session.group(2), _json(self._read_body()))
                return
            if blob is not None and method == "PUT":
                status, payload = 200, self._put_blob(blob.group(1))
            else:
                body = self._read_body()
                status, payload = self._route(method, url.path, parse_qs(url.query), body)
        except socket.timeout:  # noqa: UP041 - TimeoutError only from Python 3.10 on
            self.close_connection = True  # silent mid-request for idle_timeout: closed, no answer
            return
        except HttpError as e:
            status, payload = e.status, {"error": e.message}
        except ProtocolError as e:
            status, payload = 400, {"error": str(e)}
        except JobNotFound as e:
            status, payload = 404, {"error": f"job {e.args[0]} not found"}
        except JobConflict as e:
            status, payload = 409, {"error": str(e)}
        except ValueError as e:
            status, payload = 400, {"error": str(e)}
        except Exception as e:
            log.exception("error handling %s %s", method, self.path)
            status, payload = 500, {"error": f"internal error ({type(e).__name__})"}
        self._send(status, payload)

    def _session(self, job_id: str, kind: str, data: Any) -> None:
        """An SSH session or a forwarded connection into the job: checked, answered 101, then run on this
        connection (which is not used for HTTP again)."""
        from . import sessions

        if (self.headers.get("Upgrade") or "").lower() != UPGRADE:
            raise HttpError(400, f"{kind}: the request needs the header 'Upgrade: {UPGRADE}'")
        job = self.agent.runner.get(job_id)
        req = ExecRequest.from_dict(data) if kind == "exec" else None
        port = parse_connect(data) if kind == "connect" else 0
        if req is not None:
            sessions.argv_for(req, sessions.session_of(job))  # 409 now rather than after the 101
        self.close_connection = True
        self.send_response(101)
        self.send_header("Upgrade", UPGRADE)
        self.send_header("Connection", "Upgrade")
        self.end_headers()
        self.wfile.flush()
        try:
            if req is not None:
                sessions.run_exec(job, req, self.connection, self.rfile)  # type: ignore[arg-type]
            else:
                sessions.run_connect(job, port, self.connection)
        except (OSError, JobConflict) as e:
            log.info("session into %s ended: %s", job_id, e)

    def _read_body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise HttpError(400, "invalid Content-Length")
        if length < 0 or length > MAX_BODY:
            self.close_connection = True
            raise HttpError(413, "request body too large")
        return self.rfile.read(length) if length else b""

    def _put_blob(self, blob_hash: str) -> dict[str, Any]:
        blobs = self.agent.runner.blobs
        keep_alive = not self.close_connection
        self.close_connection = True  # until the whole body has been read
        blobs.path(blob_hash)  # ValueError (400) for a malformed hash, before reading anything
        raw = self.headers.get("Content-Length")
        if raw is None:
            raise HttpError(411, "PUT /blobs needs a Content-Length header")
        try:
            length = int(raw)
        except ValueError:
            raise HttpError(400, "invalid Content-Length")
        if length < 0 or length > MAX_BLOB:
            raise HttpError(413, "blob too large")
        size = blobs.put(blob_hash, self.rfile, length)
        self.close_connection = not keep_alive
        return {"hash": blob_hash, "size": size}

    def _has_token(self) -> bool:
        header = self.headers.get("Authorization") or ""
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.agent.token)

    def _authorize(self) -> None:
        if not self._has_token():
            self.close_connection = True  # the body (if any) stays unread: "Connection: close" says so
            raise HttpError(403, "a valid 'Authorization: Bearer <token>' header is required")

    def _send(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: bytes) -> tuple[int, Any]:  # noqa: C901
        agent = self.agent
        if path == "/health" and method == "GET":
            if not getattr(self, "authorized", False):
                return 200, {"status": "ok"}  # nothing about this host to a caller without the token
            return 200, {
                "status": "ok",
                "agent_version": AGENT_VERSION,
                "protocol_version": AGENT_PROTOCOL_VERSION,
                "uptime": time.time() - agent.started,
            }
        if path == "/info" and method == "GET":
            return 200, agent.info().to_dict()
        if path == "/jobs" and method == "POST":
            sub = JobSubmission.from_dict(_json(body))
            return 200, agent.runner.submit(agent.admit(sub)).to_dict()
        if path == "/jobs" and method == "GET":
            return 200, [s.to_dict() for s in agent.runner.list_jobs()]
        if path == "/shutdown" and method == "POST":
            agent.request_shutdown()
            return 200, {}
        blob = _BLOB_RE.match(path)
        if blob is not None and method == "GET":
            size = agent.runner.blobs.size(blob.group(1))
            if size is None:
                raise HttpError(404, f"blob {blob.group(1)} not found")
            return 200, {"hash": blob.group(1), "size": size}
        m = _JOB_RE.match(path)
        if m is None:
            if path in ("/health", "/info", "/jobs", "/shutdown"):
                raise HttpError(405, f"method {method} is not allowed on {path}")
            raise HttpError(404, f"no such endpoint: {path}")
        job_id, sub_path = m.group(1), m.group(2)
        if sub_path is None and method == "GET":
            return 200, agent.runner.get(job_id).snapshot().to_dict()
        if sub_path is None and method == "DELETE":
            agent.runner.forget(job_id)
            return 200, {}
        if sub_path == "/logs" and method == "GET":
            offset = _int_param(query, "offset", 0, 0, 2**62)
            limit = _int_param(query, "limit", 1000, 1, 10000)
            wait = _float_param(query, "wait", 0.0, 0.0, 30.0)
            known = query.get("state", [None])[-1]
            # ``acked``: the server stored what is before ``offset``
            reply = agent.runner.logs(job_id, offset, limit, wait, known, release=bool(query.get("acked")))
            if query.get("metrics_after"):
                reply.metrics = agent.sampler.since(job_id, _int_param(query, "metrics_after", 0, 0, 2**62))
            return 200, reply.to_dict()
        if sub_path == "/address" and method == "POST":
            return 200, AddressReply(agent.runner.reserve_address(job_id)).to_dict()
        if sub_path == "/stop" and method == "POST":
            data = _json(body) if body.strip() else {}
            if not isinstance(data, dict):
                raise HttpError(400, "stop: expected a JSON object")
            abort = data.get("abort", False)
            if not isinstance(abort, bool):
                raise HttpError(400, "stop.abort: expected true or false")
            deadline = data.get("deadline")
            notice = None
            if deadline is not None:
                if isinstance(deadline, bool) or not isinstance(deadline, (int, float)):
                    raise HttpError(400, "stop.deadline: expected a unix time (seconds)")
                message = data.get("message") or ""
                if not isinstance(message, str):
                    raise HttpError(400, "stop.message: expected a string")
                notice = Notice(float(deadline), message[:500])
            return 200, agent.runner.stop(job_id, abort=abort, notice=notice).to_dict()
        raise HttpError(405, f"method {method} is not allowed on {path}")


def _json(body: bytes) -> Any:
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise HttpError(400, f"invalid JSON body: {e}")


def _int_param(query: dict[str, list[str]], name: str, default: int, lo: int, hi: int) -> int:
    values = query.get(name)
    if not values:
        return default
    try:
        v = int(values[-1])
    except ValueError:
        raise HttpError(400, f"query parameter {name}: expected an integer")
    if v < lo:
        raise HttpError(400, f"query parameter {name}: must be >= {lo}")
    return min(v, hi)


def _float_param(query: dict[str, list[str]], name: str, default: float, lo: float, hi: float) -> float:
    values = query.get(name)
    if not values:
        return default
    try:
        v = float(values[-1])
    except ValueError:
        raise HttpError(400, f"query parameter {name}: expected a number")
    if not lo <= v:  # also rejects NaN
        raise HttpError(400, f"query parameter {name}: must be >= {lo}")
    return min(v, hi)


def _sandbox_pids(job: Job) -> tuple[int, ...]:
    """A sandboxed job's launcher and init (PID 1 of its namespace): processes of its tree that are not its own."""
    info = job.session
    if job.sub.image or not info or not info.get("pidns") or job.state.pid is None:
        return ()
    return (job.state.pid, int(info["pid"]))
