"""Resident memory of a process and its descendants, read from ``/proc`` (Linux only), and a sampler
thread that records the peak while workloads run.

corral's local instances are host-agent processes (``python -m corral.agent``) started by the server;
they are reported apart from the server process itself, with the jobs they run counted under them.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def rss_kib(pid: int) -> int:
    """VmRSS of one process in KiB (0 when it is gone)."""
    status = _read(f"/proc/{pid}/status")
    if status is None:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def hwm_kib(pid: int) -> int:
    """VmHWM (peak resident set since the process started) in KiB."""
    status = _read(f"/proc/{pid}/status")
    if status is None:
        return 0
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def children(pid: int) -> list[int]:
    out: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
        text = _read(f"/proc/{pid}/task/{tid}/children")
        if text:
            out.extend(int(c) for c in text.split())
    return out


def descendants(pid: int) -> list[int]:
    seen: list[int] = []
    stack = children(pid)
    while stack:
        p = stack.pop()
        seen.append(p)
        stack.extend(children(p))
    return seen


def cmdline(pid: int) -> str:
    return (_read(f"/proc/{pid}/cmdline") or "").replace("\0", " ").strip()


def naming(fragment: str) -> list[int]:
    """Processes whose command line contains ``fragment`` (e.g. a state directory an agent was started with),
    each followed by its descendants (the sandbox launchers and jobs an agent started)."""
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid() and fragment in cmdline(int(entry)):
            found += [int(entry), *descendants(int(entry))]
    return found


@dataclass
class TreeRss:
    server_kib: int
    agents_kib: int  # host agents and everything under them (their jobs)
    agents: int
    others_kib: int  # any other child of the server

    @property
    def total_kib(self) -> int:
        return self.server_kib + self.agents_kib + self.others_kib


def tree_rss(pid: int) -> TreeRss:
    server = rss_kib(pid)
    agents_kib = others_kib = n_agents = 0
    for child in children(pid):
        sub = [child, *descendants(child)]
        total = sum(rss_kib(p) for p in sub)
        if "corral.agent" in cmdline(child):
            n_agents += 1
            agents_kib += total
        else:
            others_kib += total
    return TreeRss(server, agents_kib, n_agents, others_kib)


class PeakSampler:
    """Samples the tree's RSS every ``interval`` seconds in a thread; ``peak()`` gives the maxima."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid = pid
        self.interval = interval
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._server = self._agents = self._total = 0
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def reset(self) -> None:
        with self._lock:
            self._server = self._agents = self._total = 0

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            t = tree_rss(self.pid)
            with self._lock:
                self._server = max(self._server, t.server_kib)
                self._agents = max(self._agents, t.agents_kib)
                self._total = max(self._total, t.total_kib)

    def peak(self) -> tuple[int, int, int]:
        """(server, agents, whole tree) peaks in KiB since start or the last reset."""
        with self._lock:
            return self._server, self._agents, self._total
