"""The job as the agent holds it: its directory, submission, state and the locks around them.

The one type that the host-process runner (:mod:`corral.agent.jobs`), the container runner
(:mod:`corral.agent.containers`) and the sandbox (:mod:`corral.agent.sandbox`) share. Imports only the
standard library and the agent's own protocol and log store, so none of those modules import each other
to name it.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

from .logstore import LogStore
from .protocol import JobState, JobSubmission

if TYPE_CHECKING:
    from .launcher_server import Child
    from .sandbox_types import JobSandbox


class JobNotFound(KeyError):
    pass


class JobConflict(Exception):
    """The request does not fit the job's current state (e.g. forgetting a running job)."""


#: The name of the file a preempted job reads its deadline from (in its ``/tmp``).
NOTICE_FILE = "corral-preemption"


class Notice:
    """A stop with a deadline (a preemption): SIGTERM now, SIGKILL at ``deadline`` (unix time)."""

    def __init__(self, deadline: float, message: str) -> None:
        self.deadline = deadline
        self.message = message

    def text(self) -> str:
        """The file's content, in shell syntax (``. "$CORRAL_PREEMPTION_FILE"`` reads it)."""
        return (
            f"CORRAL_PREEMPTION_DEADLINE={int(self.deadline)}\nCORRAL_PREEMPTION_MESSAGE={shlex.quote(self.message)}\n"
        )


class Job:
    def __init__(self, job_dir: str, sub: JobSubmission, state: JobState) -> None:
        self.dir = job_dir
        self.sub = sub
        self.state = state
        self.cond = threading.Condition()
        self.logs = LogStore(job_dir)
        self.proc: subprocess.Popen[bytes] | Child | None = None
        #: The git command the setup is running now (killed by a stop).
        self.setup_proc: subprocess.Popen[bytes] | None = None
        self.stop_reason: str | None = None
        self.timers: list[threading.Timer] = []
        #: The job's sandbox while it runs in one (None: a plain host process or a container).
        self.sandbox: JobSandbox | None = None
        #: Clear while the job's end gives its sandbox back (kept as the agent's spare, or removed): the job's
        #: ``forget`` waits for it, so that it never gives back a slot that is being handed on.
        self.sandbox_given_back = threading.Event()
        self.sandbox_given_back.set()
        #: Set once the job's end has handed its slot on (as the agent's spare) or given it back: no record of the
        #: host's slots names the job any more, and its ``forget`` need not look for one.
        self.slot_given_back = False
        #: How an SSH session joins the running job (see :mod:`corral.agent.sessions`): its main pid when
        #: sandboxed, its uid and gid, its user namespace's ids, its working dir, environment and shell.
        self.session: dict[str, Any] | None = None
        #: Where its network volumes are mounted on the host (unmounted when it ends), in mount order.
        self.volume_mounts: list[str] = []
        #: Where a stop with a deadline (a preemption) is written for the job to read, as the job sees it
        #: in ``CORRAL_PREEMPTION_FILE`` and on this host (None: the job has no such file).
        self.notice_path: str | None = None
        #: Whether ``state.json`` is written in place (None: not known yet, as for a job read back at a start).
        self._paged: bool | None = None

    def diag(self, text: str, at: float | None = None) -> None:
        """A line of the agent's own log of the job (what it does for it: sandbox, mounts, image, process,
        signals, exit), kept beside its output under the source ``agent``: dstack's runner log, which
        ``dstack logs -d`` shows."""
        self.logs.append("agent", [text.encode(errors="replace") + b"\n"], time.time() if at is None else at)
        self.notify()

    def snapshot(self) -> JobState:
        with self.cond:
            return JobState.from_dict(self.state.to_dict())

    def persist(self) -> None:
        """Write the job's state to ``state.json``: in place, as one page (:func:`write_page`), while it fits one;
        a larger state is written whole to a new file renamed over it, and so is every later one."""
        path = os.path.join(self.dir, "state.json")
        data = json.dumps(self.state.to_dict()).encode()  # the C encoder (``json.dump`` encodes chunk by chunk)
        if self._paged is not False and write_page(path, data, check_size=self._paged is None):
            self._paged = True
            return
        self._paged = False
        write_whole(path, data)

    def notify(self) -> None:
        with self.cond:
            self.cond.notify_all()


def join_commands(commands: list[str]) -> str:
    """The job's commands as one shell line: ``&&`` between them, a background one (``cmd &``) in braces,
    as dstack's runner joins them."""
    out = []
    for cmd in commands:
        cmd = cmd.strip()
        out.append("{ " + cmd + " }" if cmd.endswith("&") else cmd)
    return " && ".join(out)


#: The size ``state.json`` is written at in place: one page, which a write replaces whole, never in part.
STATE_PAGE = 4096


def write_page(path: str, data: bytes, check_size: bool = False) -> bool:
    """Write ``data`` over the start of the file at ``path`` (made if missing), padded with spaces to
    :data:`STATE_PAGE` (JSON ignores them): one ``pwrite`` of a page that replaces the last one whole, whatever
    was written before and whenever the agent is killed, with no new file per change (making a file and
    renaming it over the old one cost a job's start more than its own writes, on a busy disk). False, having
    written nothing, where ``data`` does not fit the page, or (``check_size``) the file is larger than one:
    the caller writes a new file instead."""
    if len(data) > STATE_PAGE:
        return False
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        if check_size and os.fstat(fd).st_size > STATE_PAGE:
            return False
        os.pwrite(fd, data.ljust(STATE_PAGE), 0)
        return True
    finally:
        os.close(fd)


def write_whole(path: str, data: bytes) -> None:
    """Replace the file at ``path`` with ``data``: a new file renamed over it."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
