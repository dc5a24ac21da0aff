"""Where a machine's CPU went between two moments, by role, read from ``/proc`` (Linux only).

:func:`sample` records the machine's busy time (``/proc/stat``: user, nice, system, irq, softirq of every CPU)
and, for every process, its own CPU time and the CPU time of the children it has reaped (``utime + stime``
and ``cutime + cstime``). :func:`report` gives, for two samples, each role's share per unit of work (a job):
a process's own time, and apart from it the time of the short-lived processes it started and reaped (an
agent's ``ip`` processes, a job launcher's jobs), which no sample sees themselves.

Roles are told by command line: corral's server, its host agents, the agents' job launchers (their fork
servers), the kernel's workers (``kworker``), and the benchmark itself. What no role claims (other
processes, the kernel outside its workers) is what is left of the machine's busy time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Sample:
    busy_ticks: int
    #: pid -> (role, start time, own ticks, reaped children's ticks)
    procs: dict[int, tuple[str, str, int, int]]


def corral_role(comm: str, cmdline: str) -> str | None:
    """The role of a process in a corral drain, or None."""
    if "corral.cli.main server" in cmdline:
        return "server"
    if "corral.agent serve" in cmdline or "corral.agent.pyz" in cmdline:
        return "agents"
    if ("-I -S -c" in cmdline and "sandbox" in cmdline) or cmdline == "corral-init":  # a fork server, a job's init
        return "job launchers"
    if comm.startswith("kworker"):
        return "kernel workers"
    if "queue_drain" in cmdline:
        return "benchmark client"
    return None


def _busy() -> int:
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    return sum(int(fields[i]) for i in (0, 1, 2, 5, 6))


def sample(role_of: Callable[[str, str], str | None] = corral_role) -> Sample:
    procs: dict[int, tuple[str, str, int, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        comm = stat[stat.find("(") + 1 : stat.rfind(")")]
        role = role_of(comm, cmdline)
        if role is None:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        own, reaped = int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
        procs[int(name)] = (role, fields[19], own, reaped)
    return Sample(_busy(), procs)


def report(before: Sample, after: Sample, per: int, unit: str = "job") -> list[str]:
    """Lines saying each role's CPU per ``unit`` (``per`` of them) between the samples, in ms."""
    own: dict[str, float] = {}
    reaped: dict[str, float] = {}
    for pid, (role, start, ticks, child_ticks) in after.procs.items():
        earlier = before.procs.get(pid)
        base = earlier if earlier is not None and earlier[1] == start else None  # not a reused pid
        own[role] = own.get(role, 0.0) + ticks - (base[2] if base else 0)
        reaped[role] = reaped.get(role, 0.0) + child_ticks - (base[3] if base else 0)
    machine = (after.busy_ticks - before.busy_ticks) * TICK_MS / per
    lines = [f"CPU per {unit} (ms, from /proc): the machine {machine:.1f}"]
    counted = 0.0
    for role in sorted(own, key=lambda r: -own[r]):
        mine, theirs = own[role] * TICK_MS / per, reaped[role] * TICK_MS / per
        counted += mine + theirs
        extra = f", and {theirs:.1f} in the processes it started and reaped" if theirs >= 0.05 else ""
        lines.append(f"  {role:<16} {mine:6.1f}{extra}")
    lines.append(f"  {'the rest':<16} {machine - counted:6.1f}  (other processes and the kernel outside its workers)")
    return lines
