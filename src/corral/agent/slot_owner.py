"""Who holds a sandbox slot: what an agent writes into each slot record it makes, and whether that agent is
still running.

Another agent's start (``Sandboxes.reap``) gives back the slots of an agent whose work dir is gone: that
agent can never come back for them. Its process may still be running, though -- ending, its instance's
directory already removed -- and still acting on its slots (tearing down its jobs' networks, its spare's); had
its slots been given back and taken by another agent meanwhile, it would remove that agent's namespace.
So a record also names its agent's process (pid, start time and PID namespace, which together tell it from a
later process with the same pid), and a slot whose agent still runs is left to that agent, which gives its
slots back itself as it ends. A record from before this (no pid) is judged by its work dir alone.
"""

from __future__ import annotations

import os
from typing import Any


def _stat_start(pid: int) -> str | None:
    """The process's start time (``/proc/<pid>/stat``'s 22nd field), or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # after the command, which may hold spaces and parentheses
    if not fields or fields[0] in ("Z", "X"):  # a zombie runs no more: killed, not yet waited for
        return None
    return fields[19] if len(fields) > 19 else None


def _pid_ns() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


_mine: dict[str, Any] = {}


def owner() -> dict[str, Any]:
    """This agent's process, as its slot records name it."""
    if _mine.get("pid") != os.getpid():  # computed once per process
        _mine.clear()
        _mine.update(pid=os.getpid(), pid_start=_stat_start(os.getpid()), pidns=_pid_ns())
    return dict(_mine)


def running(record: dict[str, Any]) -> bool:
    """Whether the agent that wrote ``record`` is still running (seen from this PID namespace; a record
    written in another one, or before records named their agent, is not known to run)."""
    pid = record.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or record.get("pidns") != _pid_ns():
        return False
    start = _stat_start(pid)
    return start is not None and start == record.get("pid_start")
