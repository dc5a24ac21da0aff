"""Process-group helpers: signal a job's group, and find/kill what a dead agent left behind.

Every job runs in its own session (``start_new_session``), so its leader's pid is also its
process-group id and session id. After an agent restart the leader may be gone while its
children live on; :func:`reap_group` finds them by (pgrp, session) in ``/proc`` and only kills
processes that started no earlier than the job did, so a recycled pid is never hit.
"""

from __future__ import annotations

import os
import signal
import time


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to the process group; False if it no longer exists."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


def _boot_time() -> float | None:
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _group_members(pgid: int, not_before: float | None) -> list[int]:
    btime = _boot_time()
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/" + name + "/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        try:
            state, pgrp, sid, start_ticks = fields[0], int(fields[2]), int(fields[3]), int(fields[19])
        except (IndexError, ValueError):
            continue
        if pgrp != pgid or sid != pgid or state in (b"Z", b"X"):
            continue
        if not_before is not None and btime is not None and btime + start_ticks / ticks < not_before - 2:
            continue  # older than the job: a recycled id, not ours
        members.append(int(name))
    return members


def reap_group(pgid: int, not_before: float | None) -> int:
    """SIGKILL every live process of the job's group/session; returns how many were found."""
    if not os.path.isdir("/proc"):
        return 1 if signal_group(pgid, signal.SIGKILL) else 0
    found = 0
    for _ in range(5):
        members = _group_members(pgid, not_before)
        if not members:
            break
        found += len(members)
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
    return found


def is_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X")
    except OSError:
        pass
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
