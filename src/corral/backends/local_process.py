"""Processes this server starts on its own machine and leaves running past its own life: the local backend's
agents and a local fleet's gateway. Each is started detached (a session of its own, stdin closed, its output
appended to a log file), found again by the pid it recorded, and stopped with its whole process group.

May import: the standard library only.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


def spawn_detached(argv: Sequence[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a session of its own (it outlives this server), its output appended to ``log_path``."""
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True
        )
    finally:
        log.close()


def log_tail(log_path: Path, limit: int = 800) -> str:
    """The end of a process's log, for a message saying why it stopped."""
    try:
        return log_path.read_text(errors="replace")[-limit:].strip()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def reap(pid: int) -> bool:
    """Collect ``pid``'s exit if it is this process's child and has ended; whether it is gone (reaped now, or not
    this process's child and not running)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not this process's child, or reaped already
        return not alive(pid)
    return done == pid


async def wait_gone(pid: int, timeout: float) -> None:
    """Wait up to ``timeout`` seconds for ``pid`` to end, reaped if it is this process's child (a process whose
    main thread has exited shows as a zombie while its other threads still end: it is gone once reaped)."""
    deadline = time.monotonic() + timeout
    while not reap(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


def kill_group(pid: int) -> None:
    """SIGKILL ``pid`` and its process group (what it started), and reap it if it is this process's child."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


async def stop(pid: int, grace: float) -> None:
    """SIGTERM ``pid``, give it ``grace`` seconds to end, then kill its group (and reap it)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    await wait_gone(pid, grace)
    kill_group(pid)
    await wait_gone(pid, 5.0)


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts connections on ``host:port`` of this machine."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def free_port() -> int:
    """A port of this machine's loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
