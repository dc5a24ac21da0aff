"""Sessions into a running job (a host process, or a container: :mod:`corral.agent.container_sessions`),
on a connection the server upgraded (wire format: :mod:`corral.agent.protocol_session`): a command or a
shell (with a pty or pipes) started by the session launcher (:mod:`corral.agent.session_exec`) in the
job's sandbox or container, as its user, with its environment and working dir; or a TCP connection to one
of the job's ports (at its container's or sandbox's address, else on loopback).

Threads only (standard library): one that reads the server's frames, one per output stream, and the
caller's, which waits for the command and sends its exit status last. A connection that drops kills the
session's process group.
"""

from __future__ import annotations

import json
import logging
import marshal
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from typing import IO, Any

from . import procs
from .container_sessions import UNAVAILABLE
from .job import Job, JobConflict
from .portfwd import _copy
from .protocol_session import (
    EXIT,
    HEADER,
    MAX_FRAME,
    SIGNAL,
    STDERR,
    STDIN,
    STDIN_EOF,
    STDOUT,
    WINDOW,
    ExecRequest,
    frame,
)

log = logging.getLogger("corral.agent")

#: Where distributions keep OpenSSH's sftp-server (``sftp`` and plain ``scp`` use it).
SFTP_SERVERS = (
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/openssh/sftp-server",
    "/usr/lib/ssh/sftp-server",
    "/usr/libexec/sftp-server",
    "/usr/lib/sftp-server",
)
_launcher: list[str] = []


def _launcher_source() -> str:
    if not _launcher:
        from . import session_exec

        loader = getattr(session_exec, "__loader__", None)
        source = loader.get_source(session_exec.__name__) if loader is not None else None  # zipapp too
        if source is None:
            with open(session_exec.__file__) as f:
                source = f.read()
        _launcher.append(source)
    return _launcher[0]


def session_of(job: Job) -> dict[str, Any]:
    """What a session needs to join ``job`` (JobConflict when it is not running, or a session cannot join
    its container)."""
    with job.cond:
        running = job.state.state == "running"
        if not job.sub.image:
            running = running and job.proc is not None and job.proc.returncode is None
        info = job.session
    if not running or info is None:
        raise JobConflict(f"job {job.sub.job_id} is not running")
    if UNAVAILABLE in info:
        raise JobConflict(str(info[UNAVAILABLE]))
    return info


def argv_for(req: ExecRequest, info: dict[str, Any]) -> list[str]:
    shell = str(info.get("shell") or "/bin/sh")
    if req.subsystem == "sftp":
        root = str(info.get("root") or "")  # a container's: its own files, not the host's
        found = next((p for p in SFTP_SERVERS if os.path.exists(root + p)), None)
        if found is None:
            where = "the job's image" if root else "this host"
            raise JobConflict(f"{where} has no sftp-server (install OpenSSH's, e.g. openssh-sftp-server)")
        return [found]
    if req.command is None:
        return [shell, "-l"] if req.pty else [shell, "-l", "-s"]
    return [shell, "-c", req.command]


def run_exec(job: Job, req: ExecRequest, sock: socket.socket, rfile: IO[bytes]) -> None:  # noqa: C901, PLR0915
    """Run the session until its command exits (its status sent) or the connection drops."""
    info = session_of(job)
    argv = argv_for(req, info)
    env = dict(info["env"])
    env.update({k: v for k, v in (req.env or {}).items() if k == "LANG" or k.startswith("LC_")})
    if req.pty:
        env["TERM"] = req.term or "xterm-256color"
    spec = {**info, "argv": argv, "env": env, "tty": req.pty}
    cmd = [sys.executable or "python3", "-I", "-S", "-c", _launcher_source(), marshal.dumps(spec).hex()]
    master = slave = -1
    if req.pty:
        master, slave = os.openpty()
        _resize(master, req.cols, req.rows)
        stdio: dict[str, Any] = {"stdin": slave, "stdout": slave, "stderr": slave}
    else:
        stdio = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    try:
        proc = subprocess.Popen(cmd, start_new_session=True, close_fds=True, cwd="/", **stdio)
    finally:
        if slave >= 0:
            os.close(slave)
    lock = threading.Lock()

    def send(kind: bytes, payload: bytes = b"") -> None:
        with lock:
            sock.sendall(frame(kind, payload))

    out_fds: list[tuple[int, bytes]]
    if req.pty:
        stdin_fd = master
        out_fds = [(master, STDOUT)]
    else:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        stdin_fd = proc.stdin.fileno()
        out_fds = [(proc.stdout.fileno(), STDOUT), (proc.stderr.fileno(), STDERR)]
    dropped = threading.Event()
    readers = [_thread(_pump_out, fd, kind, send) for fd, kind in out_fds]
    _thread(_pump_in, rfile, stdin_fd, master if req.pty else -1, proc, dropped)
    try:
        rc = proc.wait()
        for t in readers:
            t.join(2.0 if req.pty else 10.0)  # a pty held by a background process: do not wait for it
        status: dict[str, Any] = {"status": rc, "signal": None}
        if rc < 0:
            status = {"status": None, "signal": _signame(-rc)}
        if not dropped.is_set():
            send(EXIT, json.dumps(status).encode())
    except OSError:
        pass
    finally:
        procs.signal_group(proc.pid, signal.SIGKILL)
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if f is not None:
                f.close()
        if master >= 0:
            try:
                os.close(master)
            except OSError:
                pass


def run_connect(job: Job, port: int, sock: socket.socket) -> None:
    """Relay ``sock`` to the job's ``port`` (its container's or its sandbox's address, else loopback) until
    either side ends."""
    with job.cond:
        running = job.state.state == "running"
        sb = job.sandbox
        info = job.session
    if not running:
        raise JobConflict(f"job {job.sub.job_id} is not running")
    if job.sub.image:
        if info is None or UNAVAILABLE in info:
            raise JobConflict(str((info or {}).get(UNAVAILABLE) or f"job {job.sub.job_id} is not running"))
        host = str(info.get("address") or "127.0.0.1")  # the container's address on its network
    else:
        host = sb.address if sb is not None and sb.address else "127.0.0.1"
    upstream = socket.create_connection((host, port), timeout=10)
    upstream.settimeout(None)
    t = _thread(_copy, upstream, sock)
    _copy(sock, upstream)
    t.join()
    upstream.close()


def _thread(fn: Any, *args: Any) -> threading.Thread:
    t = threading.Thread(target=fn, args=args, name="session")
    t.daemon = True
    t.start()
    return t


def _pump_out(fd: int, kind: bytes, send: Any) -> None:
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the pty's last holder closed it
            return
        if not data:
            return
        try:
            send(kind, data)
        except OSError:
            return


def _pump_in(rfile: IO[bytes], stdin_fd: int, master: int, proc: subprocess.Popen[bytes], dropped: Any) -> None:  # noqa: C901
    try:
        while True:
            head = rfile.read(HEADER.size)
            if len(head) < HEADER.size:
                break
            kind, size = HEADER.unpack(head)
            if size > MAX_FRAME:
                break
            payload = rfile.read(size) if size else b""
            if len(payload) < size:
                break
            if kind == STDIN:
                _write_all(stdin_fd, payload)
            elif kind == STDIN_EOF:
                if master < 0 and proc.stdin is not None:
                    proc.stdin.close()
            elif kind == WINDOW and master >= 0:
                size_ = json.loads(payload)
                _resize(master, int(size_.get("cols", 80)), int(size_.get("rows", 24)))
            elif kind == SIGNAL:
                sig = getattr(signal, "SIG" + payload.decode(errors="replace"), None)
                if isinstance(sig, signal.Signals):
                    procs.signal_group(proc.pid, sig)
    except (OSError, ValueError):
        pass
    if proc.returncode is None and proc.poll() is None:
        dropped.set()  # the client went away: the session ends with it
        procs.signal_group(proc.pid, signal.SIGHUP)
        try:
            proc.wait(2.0)
        except subprocess.TimeoutExpired:
            procs.signal_group(proc.pid, signal.SIGKILL)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _resize(master: int, cols: int, rows: int) -> None:
    import fcntl
    import termios

    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name[3:]
    except ValueError:
        return str(sig)
