"""The agent's side of the launcher's fork server (:func:`corral.agent.sandbox_exec.serve`).

A sandboxed job used to start as a fresh ``python3 -I -S`` running the launcher: about 15 ms of CPU and
20 ms of wall time per job before the launcher's own work. The fork server is that interpreter started
once per agent; each job is a fork of it, the job's init: PID 1 of a PID namespace of its own, which
starts the job's command. The server, the init's parent, reaps it and sends its wait status here; the init
wrote the command's on a pipe of the job's before it ended (the init's own counts when it was killed
first). :class:`Child` stands for the job's process where the agent held a ``subprocess.Popen`` (``pid``,
``stdout``, ``stderr``, ``poll``, ``wait``, ``returncode``).

If the server cannot be started, :meth:`LauncherServer.spawn` raises :class:`Unavailable` and the caller
starts the launcher as a process of its own, as before. If the server dies while jobs run (it never should),
their ends are lost to it: each such :class:`Child` ends with :data:`LOST` (the job fails saying so, and its
process group is killed), and the next job starts a new server.
"""

from __future__ import annotations

import itertools
import logging
import marshal
import os
import socket
import subprocess
import sys
import threading
from typing import IO, Any

log = logging.getLogger("corral.agent")

#: The return code of a job whose end the fork server could not report (it exited while the job ran).
LOST = 255


class Unavailable(Exception):
    """The fork server could not be started (the caller starts the launcher the old way)."""


class Child:
    """A job's process, forked by the fork server: the part of ``subprocess.Popen`` the agent uses."""

    def __init__(self, stdout: IO[bytes], stderr: IO[bytes], report: int = -1) -> None:
        self.pid = 0  # until the server answers
        self._report = report  # the read end of the pipe its init writes the command's wait status on
        self.stdout: IO[bytes] | None = stdout
        self.stderr: IO[bytes] | None = stderr
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _end(self, returncode: int) -> None:
        if self.returncode is None:
            self.returncode = returncode
        self._ended.set()
        if self._report >= 0:
            os.close(self._report)
            self._report = -1

    def _reported(self, status: int) -> int:
        """The wait status of the job's command, as its init wrote it before ending; else (the init was killed
        first) ``status``, the init's own. Read once the init has ended: its write is there, or never comes."""
        try:
            words = os.read(self._report, 64) if self._report >= 0 else b""
        except OSError:
            words = b""
        return int(words) if words.strip().isdigit() else status

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None and self.pid > 0:
            try:
                os.kill(self.pid, 9)
            except OSError:
                pass


class LauncherServer:
    """The server's process and the reader of its answers. A job's :class:`Child` is known before its request
    is sent (by request id, then by pid once the server answers), and the server answers a fork before it
    reports that child's end, so every end finds its child."""

    def __init__(self, source: str) -> None:
        self._source = source
        self._lock = threading.Lock()  # one request at a time, and the server's start
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._ids = itertools.count(1)
        self._failed = False
        #: guards what follows; notified when a request is answered
        self._answered = threading.Condition()
        #: request id -> the child it asks for, until the server answers with its pid
        self._pending: dict[int, Child] = {}
        #: pid -> a child the server forked and has not reported ended
        self._children: dict[int, Child] = {}

    def _start(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        if self._failed:
            raise Unavailable("the launcher's fork server could not be started")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable or "python3", "-I", "-S", "-c", self._source, "--serve", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as e:
            ours.close()
            self._failed = True
            raise Unavailable(f"cannot start the launcher's fork server: {e}") from None
        finally:
            theirs.close()
        self._sock = ours
        threading.Thread(target=self._read, args=(ours, self._proc), name="launcher-server", daemon=True).start()
        return ours

    def _read(self, sock: socket.socket, proc: subprocess.Popen[bytes]) -> None:
        while True:
            try:
                msg = sock.recv(1 << 16)
            except OSError:
                msg = b""
            if not msg:
                break
            kind, key, value = marshal.loads(msg)
            with self._answered:
                if kind == "pid":  # key: the request's id, value: the pid (negative: the fork failed)
                    child = self._pending.pop(key, None)
                    if child is not None:
                        child.pid = value
                        if value > 0:
                            self._children[value] = child
                    self._answered.notify_all()
                    continue
                child = self._children.pop(key, None)  # "exit": key the init's pid, value its wait status
            if child is not None:
                child._end(_returncode(child._reported(value)))
        # the server is gone: whatever it had not answered or reported is lost to it (a new server's children
        # are registered only once ``_sock`` is its own, after this)
        with self._answered:
            if self._sock is sock:
                self._sock = None
            lost = list(self._children.values())
            self._children.clear()
            self._pending.clear()  # their spawn() sees no pid
            self._answered.notify_all()
        if lost:
            log.error("the launcher's fork server exited with %d job(s) running; they are lost", len(lost))
        for child in lost:
            child._end(LOST)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass

    def spawn(self, spec: dict[str, Any], env: dict[str, str], cwd: str, status_w: int, go_r: int) -> Child:
        """Fork the launcher for ``spec`` (its stdin /dev/null, its stdout and stderr pipes read by the caller
        through the returned :class:`Child`). The caller keeps ``status_w`` and ``go_r``, and closes them."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        report_r, report_w = os.pipe()
        devnull = os.open(os.devnull, os.O_RDONLY)
        child = Child(os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"), report_r)
        try:
            self._fork(child, spec, env, cwd, [devnull, out_w, err_w, status_w, go_r, report_w])
        except BaseException:
            for stream in (child.stdout, child.stderr):
                if stream is not None:
                    stream.close()
            os.close(report_r)
            raise
        finally:
            for fd in (out_w, err_w, devnull, report_w):
                os.close(fd)
        return child

    def _fork(self, child: Child, spec: dict[str, Any], env: dict[str, str], cwd: str, fds: list[int]) -> None:
        with self._lock:
            sock = self._start()
            req_id = next(self._ids)
            with self._answered:
                if self._sock is not sock:
                    raise Unavailable("the launcher's fork server exited")
                self._pending[req_id] = child
            msg = marshal.dumps({"id": req_id, "spec": spec, "env": env, "cwd": cwd})
            try:
                socket.send_fds(sock, [msg], fds)
            except OSError as e:
                with self._answered:
                    self._pending.pop(req_id, None)
                raise Unavailable(f"the launcher's fork server is gone: {e}") from None
            with self._answered:
                while req_id in self._pending:
                    self._answered.wait(5.0)
        if child.pid == 0:
            raise Unavailable("the launcher's fork server exited")
        if child.pid < 0:
            raise OSError("the launcher's fork server could not fork (its message is on the status pipe)")

    def close(self) -> None:
        """The server exits once its socket closes (jobs it started run on, as a stopped agent's do)."""
        with self._lock:
            sock, self._sock = self._sock, None
            proc = self._proc
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # the server's end hears it (a close alone would wait for our reader)
            except OSError:
                pass
            sock.close()
        if proc is not None:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()


def _returncode(status: int) -> int:
    """A wait status as ``subprocess`` gives it: the exit code, or minus the signal that killed it."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return LOST
