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
from typing import TYPE_CHECKING, Any

from .logstore import LogStore
from .protocol import JobState, JobSubmission

if TYPE_CHECKING:
    from .launcher_server import Child
    from .sandbox import JobSandbox


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
        #: How an SSH session joins the running job (see :mod:`corral.agent.sessions`): its main pid when
        #: sandboxed, its uid and gid, its user namespace's ids, its working dir, environment and shell.
        self.session: dict[str, Any] | None = None
        #: Where its network volumes are mounted on the host (unmounted when it ends), in mount order.
        self.volume_mounts: list[str] = []
        #: Where a stop with a deadline (a preemption) is written for the job to read, as the job sees it
        #: in ``CORRAL_PREEMPTION_FILE`` and on this host (None: the job has no such file).
        self.notice_path: str | None = None

    def snapshot(self) -> JobState:
        with self.cond:
            return JobState.from_dict(self.state.to_dict())

    def persist(self) -> None:
        write_json(os.path.join(self.dir, "state.json"), self.state.to_dict())

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


def write_json(path: str, data: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(data))  # the C encoder: ``json.dump`` encodes in Python, chunk by chunk
    os.replace(tmp, path)
