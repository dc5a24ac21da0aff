"""Starting a job in its sandbox: the launcher's spec, its fork server, and the wait until the job runs.

:class:`Launcher` (held by :class:`corral.agent.sandbox.Sandboxes`) builds what the launcher
(:mod:`corral.agent.sandbox_exec`) is given and starts it -- forked by the agent's launcher server
(:mod:`corral.agent.launcher_server`), started on the first job, or as a process of its own where that server
cannot start. :func:`start` waits until the job runs (or says why it could not).
"""

from __future__ import annotations

import functools
import logging
import marshal
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .launcher_server import Child, LauncherServer, Unavailable
from .sandbox_types import JobSandbox, SandboxConfig, SandboxError

log = logging.getLogger("corral.agent")


class Launcher:
    """Starts this agent's jobs in their sandboxes (``work_dir``: the agent's, hidden from every job)."""

    def __init__(self, config: SandboxConfig, work_dir: str) -> None:
        self.config = config
        self.work_dir = work_dir
        self._helper: str | None = None
        self._server: LauncherServer | None = None

    def _launcher_source(self) -> str:
        if self._helper is None:
            from . import sandbox_exec  # loads libc: only once a job needs it

            path = sandbox_exec.__file__
            loader = getattr(sandbox_exec, "__loader__", None)
            source = loader.get_source(sandbox_exec.__name__) if loader is not None else None  # zipapp too
            if source is None:
                with open(path) as f:
                    source = f.read()
            self._helper = source
        return self._helper

    def spec(
        self,
        sb: JobSandbox,
        argv: list[str],
        cwd: str,
        binds: dict[str, str],
        root: str,
        pipes: Pipes,
        inside: tuple[int, int] | None,
    ) -> dict[str, Any]:
        """What the launcher is given (see :mod:`corral.agent.sandbox_exec`): plain values only (marshal)."""
        return {
            "netns": sb.netns,
            "root": root,
            "binds": binds,
            "hide": sorted({self.work_dir, *self.config.hide}),
            "cwd": cwd,
            "uid": sb.uid,
            "gid": sb.uid,
            "status_fd": pipes.status_w,
            "go_fd": pipes.go_r,
            "inside": list(inside) if inside is not None else None,
            "argv": argv,
        }

    def command(self, spec: dict[str, Any]) -> list[str]:
        """The command line that starts the job of ``spec`` through a launcher process of its own."""
        # marshal (of plain values only): the launcher reads it without importing json
        return [sys.executable or "python3", "-I", "-S", "-c", self._launcher_source(), marshal.dumps(spec).hex()]

    def launch(
        self,
        sb: JobSandbox,
        argv: list[str],
        cwd: str,
        binds: dict[str, str],
        root: str,
        inside: tuple[int, int] | None,
        env: dict[str, str],
        job_dir: str,
    ) -> Launched:
        """Start ``argv`` in the sandbox, forked by this agent's launcher server (a launcher process of its own
        where that server cannot start), and wait until it runs (:func:`start`). Its stdin is /dev/null, its
        stdout and stderr pipes; its session is its own."""
        pipes = Pipes.open()
        spec = self.spec(sb, argv, cwd, binds, root, pipes, inside)
        if self._server is None:
            self._server = LauncherServer(self._launcher_source())
        try:
            spawn = functools.partial(self._server.spawn, spec, env, job_dir, pipes.status_w, pipes.go_r)
            return start(spawn, pipes, inside, sb.uid)
        except Unavailable as e:
            log.warning("%s; starting the job's launcher as a process of its own", e)
        pipes = Pipes.open()  # the first were closed with the attempt
        cmd = self.command(self.spec(sb, argv, cwd, binds, root, pipes, inside))

        def popen() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                cmd,
                pass_fds=(pipes.status_w, pipes.go_r),
                cwd=job_dir,
                env=env,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )

        return start(popen, pipes, inside, sb.uid)

    def close(self) -> None:
        """Let the launcher server go (at the agent's shutdown)."""
        if self._server is not None:
            self._server.close()
            self._server = None


@dataclass(frozen=True)
class Pipes:
    """The launcher's status pipe (it writes) and go pipe (the agent writes)."""

    status_r: int
    status_w: int
    go_r: int
    go_w: int

    @classmethod
    def open(cls) -> Pipes:
        status_r, status_w = os.pipe()
        go_r, go_w = os.pipe()
        return cls(status_r, status_w, go_r, go_w)


@dataclass(frozen=True)
class Launched:
    """A job started in its sandbox: ``proc`` its process for the agent (outside the job's PID namespace; its
    pid is the job's process group and session), ``init_pid`` the host's pid of the job's init (PID 1 of the
    namespace, in all the job's namespaces: sessions join them through it)."""

    proc: subprocess.Popen[bytes] | Child
    init_pid: int


def start(
    spawn: Callable[[], subprocess.Popen[bytes] | Child], pipes: Pipes, inside: tuple[int, int] | None, uid: int
) -> Launched:
    """Start the launcher (``spawn``: it is given the status pipe's write end and the go pipe's read end, which
    are closed here once it has them) and wait until the job runs (the status pipe closes) or fails (a line on
    it); on its ``map`` line, map ``inside`` (uid, gid) of the init's user namespace to ``uid`` outside."""
    status_r, status_w, go_r, go_w = pipes.status_r, pipes.status_w, pipes.go_r, pipes.go_w
    try:
        proc = spawn()
    except BaseException:
        os.close(status_r)
        os.close(go_w)
        raise
    finally:
        os.close(status_w)
        os.close(go_r)
    words, init = "", 0
    try:
        with os.fdopen(status_r, "rb") as f:
            while True:
                line = f.readline()
                if line.startswith(b"pid ") and line[4:].strip().isdigit():
                    init = int(line[4:])
                elif line == b"map\n" and inside is not None and init > 0:
                    for name, value in (("uid_map", inside[0]), ("gid_map", inside[1])):
                        with open(f"/proc/{init}/{name}", "w") as m:
                            m.write(f"{value} {uid} 1\n")
                    os.write(go_w, b"g")
                else:
                    words = (line + f.read(4096)).decode(errors="replace").strip()
                    break
    except OSError as e:
        words = f"cannot map the job's user: {e}"
    finally:
        os.close(go_w)
    if not words and init <= 0:
        words = "the job's launcher did not name the job's init"
    if words:
        proc.kill()
        proc.wait()
        raise SandboxError(words)
    return Launched(proc, init)
