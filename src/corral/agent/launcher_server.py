"""The agent's side of the launcher's fork server (:func:`corral.agent.sandbox_exec.serve`).

A sandboxed job used to start as a fresh ``python3 -I -S`` running the launcher: about 15 ms of CPU and
20 ms of wall time per job before the launcher's own work. The fork server is that interpreter started
once per agent; each job is a fork of it. It is the job's parent, so it reaps the job and sends its wait
status here: :class:`Child` stands for the job's process where the agent held a ``subprocess.Popen``
(``pid``, ``stdout``, ``stderr``, ``poll``, ``wait``, ``returncode``).

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

    def __init__(self, pid: int, stdout: IO[bytes] | None, stderr: IO[bytes] | None) -> None:
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        #: the fork server's generation that forked it
        self.gen = 0
        self._ended = threading.Event()

    def _end(self, returncode: int) -> None:
        if self.returncode is None:
            self.returncode = returncode
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, 9)
            except OSError:
                pass


class LauncherServer:
    def __init__(self, source: str) -> None:
        self._source = source
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._ids = itertools.count(1)
        #: request id -> the pid the server answered (or an exception), set by the reader thread
        self._answers: dict[int, int] = {}
        self._answered = threading.Condition()
        self._children: dict[int, Child] = {}
        #: exit statuses that arrived before their child was known (never, by the server's order; kept safe)
        self._early: dict[int, int] = {}
        self._failed = False
        #: the server's generation (one per start) and those that exited
        self._gen = 0
        self._dead: set[int] = set()

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
        self._gen += 1
        reader = threading.Thread(
            target=self._read, args=(ours, self._proc, self._gen), name="launcher-server", daemon=True
        )
        reader.start()
        return ours

    def _read(self, sock: socket.socket, proc: subprocess.Popen[bytes], gen: int) -> None:
        while True:
            try:
                msg = sock.recv(1 << 16)
            except OSError:
                msg = b""
            if not msg:
                break
            kind, key, value = marshal.loads(msg)
            if kind == "pid":
                with self._answered:
                    self._answers[key] = value
                    self._answered.notify_all()
            elif kind == "exit":
                with self._answered:
                    child = self._children.pop(key, None)
                    if child is None:
                        self._early[key] = value
                        continue
                child._end(_returncode(value))
        # the server is gone: whatever it had not reported is lost to it
        with self._answered:
            if self._sock is sock:
                self._sock = None
            lost = [c for c in self._children.values() if c.gen == gen]
            self._children = {pid: c for pid, c in self._children.items() if c.gen != gen}
            self._dead.add(gen)
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
        devnull = os.open(os.devnull, os.O_RDONLY)
        try:
            pid, gen = self._fork(spec, env, cwd, [devnull, out_w, err_w, status_w, go_r])
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            for fd in (out_w, err_w, devnull):
                os.close(fd)
        child = Child(pid, os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"))
        child.gen = gen
        with self._answered:
            early = self._early.pop(pid, None)
            lost = gen in self._dead
            if early is None and not lost:
                self._children[pid] = child
        if early is not None:
            child._end(_returncode(early))
        elif lost:
            child._end(LOST)
        return child

    def _fork(self, spec: dict[str, Any], env: dict[str, str], cwd: str, fds: list[int]) -> tuple[int, int]:
        with self._lock:
            sock = self._start()
            gen = self._gen
            req_id = next(self._ids)
            msg = marshal.dumps({"id": req_id, "spec": spec, "env": env, "cwd": cwd})
            try:
                socket.send_fds(sock, [msg], fds)
            except OSError as e:
                raise Unavailable(f"the launcher's fork server is gone: {e}") from None
            with self._answered:
                while req_id not in self._answers and self._sock is sock:
                    self._answered.wait(5.0)
                pid = self._answers.pop(req_id, None)
        if pid is None:
            raise Unavailable("the launcher's fork server exited")
        if pid < 0:
            raise OSError("the launcher's fork server could not fork (its message is on the status pipe)")
        return pid, gen

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
