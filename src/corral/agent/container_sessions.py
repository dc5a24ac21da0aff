"""How an SSH session joins a job's running container, as ``docker exec`` would: what
:mod:`corral.agent.sessions` needs (``Job.session``), made from the container's inspect document.

The session launcher (:mod:`corral.agent.session_exec`) joins the container's network, mount and PID
namespaces through its main process (``State.Pid``) and its cgroups, so the session sees the container's
files and ports and is held to its limits; it runs as the container's user (``Config.User``: a name is
looked up in the container's own ``/etc/passwd`` and ``/etc/group``), with the container's environment
(``Config.Env``) in its working dir (``Config.WorkingDir``), under ``/bin/bash`` when the image has it.
A forwarded connection goes to the container's address on its network (loopback with host networking).

That needs the Docker engine on this host (its containers' processes in this host's ``/proc``); where it
is not (a remote ``DOCKER_HOST``), the session says so. Standard library only.
"""

from __future__ import annotations

import os
from typing import Any

#: What :func:`session_info` answers when a session cannot join the container (``unavailable``: why).
UNAVAILABLE = "unavailable"


def _lookup(path: str, name: str) -> list[str] | None:
    """The ``name:...`` line of a passwd/group file, split (None if it is not there)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.rstrip("\n").split(":")
                if fields and fields[0] == name:
                    return fields
    except OSError:
        return None
    return None


def resolve_user(root: str, user: str) -> tuple[int, int, str]:
    """The uid, gid and home of ``Config.User`` (``name``, ``uid``, ``name:group``, ``uid:gid``; empty: root)
    in the container whose root filesystem is ``root``."""
    name, _, group = (user or "root").partition(":")
    if name.isdigit():
        uid, gid, home = int(name), int(name), "/"
        for_uid = None
        try:
            with open(os.path.join(root, "etc/passwd"), encoding="utf-8", errors="replace") as f:
                for line in f:
                    fields = line.rstrip("\n").split(":")
                    if len(fields) >= 6 and fields[2] == name:
                        for_uid = fields
                        break
        except OSError:
            pass
        if for_uid is not None:
            gid, home = int(for_uid[3]), for_uid[5] or "/"
    else:
        entry = _lookup(os.path.join(root, "etc/passwd"), name)
        if entry is None or len(entry) < 6:
            raise ValueError(f"user {name!r} is not in the container's /etc/passwd")
        uid, gid, home = int(entry[2]), int(entry[3]), entry[5] or "/"
    if group:
        if group.isdigit():
            gid = int(group)
        else:
            entry = _lookup(os.path.join(root, "etc/group"), group)
            if entry is None or len(entry) < 3:
                raise ValueError(f"group {group!r} is not in the container's /etc/group")
            gid = int(entry[2])
    return uid, gid, home


def cgroup_procs(pid: int, proc: str = "/proc", sys_cgroup: str = "/sys/fs/cgroup") -> list[str]:
    """The ``cgroup.procs`` files that put a process into ``pid``'s cgroups (v2: one; v1: one per hierarchy)."""
    out: list[str] = []
    try:
        with open(f"{proc}/{pid}/cgroup", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not path.startswith("/"):
            continue
        if hier == "0" and not controllers:
            out.append(os.path.join(sys_cgroup, path.lstrip("/"), "cgroup.procs"))
        else:
            for c in controllers.split(","):
                c = c.removeprefix("name=")
                if c:
                    out.append(os.path.join(sys_cgroup, c, path.lstrip("/"), "cgroup.procs"))
    return [p for p in out if os.path.exists(p)]


def _address(inspected: dict[str, Any]) -> str:
    settings = inspected.get("NetworkSettings") or {}
    if settings.get("IPAddress"):
        return str(settings["IPAddress"])
    for net in (settings.get("Networks") or {}).values():
        if isinstance(net, dict) and net.get("IPAddress"):
            return str(net["IPAddress"])
    return "127.0.0.1"  # host networking: the container's ports are this host's


def session_info(inspected: dict[str, Any], proc: str = "/proc") -> dict[str, Any]:
    """``Job.session`` for a running container (``{"unavailable": why}`` when a session cannot join it)."""
    state = inspected.get("State") or {}
    pid = state.get("Pid")
    if not isinstance(pid, int) or pid <= 0 or not state.get("Running"):
        return {UNAVAILABLE: "the job's container is not running"}
    root = f"{proc}/{pid}/root"
    if not os.path.exists(f"{proc}/{pid}/ns/mnt"):
        return {UNAVAILABLE: "SSH sessions into containers need the Docker engine on the job's host"}
    config = inspected.get("Config") or {}
    try:
        uid, gid, home = resolve_user(root, str(config.get("User") or ""))
    except (ValueError, OSError) as e:
        return {UNAVAILABLE: f"cannot run a session as the container's user: {e}"}
    env: dict[str, str] = {}
    for item in config.get("Env") or []:
        key, sep, value = str(item).partition("=")
        if sep:
            env[key] = value
    env.setdefault("HOME", home)
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    shell = "/bin/bash" if os.path.exists(os.path.join(root, "bin/bash")) else "/bin/sh"
    return {
        "pid": pid,
        "uid": uid,
        "gid": gid,
        "inside": None,
        "pidns": True,
        "cwd": str(config.get("WorkingDir") or home or "/"),
        "env": env,
        "shell": shell,
        "root": root,
        "cgroups": cgroup_procs(pid, proc),
        "address": _address(inspected),
    }
