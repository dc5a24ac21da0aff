"""The session launcher: the first process of an SSH session into a running job, which becomes the
session's command.

Started by :mod:`corral.agent.sessions` as ``python3 -I -S -c <this file's source> <spec>`` (a fresh,
single-threaded interpreter, as :mod:`corral.agent.sandbox_exec`). For a job in a sandbox or a container
(:mod:`corral.agent.container_sessions`) it joins the job's network, IPC, mount and PID namespaces
(``setns`` on ``/proc/<pid>/ns/...`` of the job's init or container: the job's ``/``, network, IPC objects and
processes) and, when the job has one, its user namespace, last; a container's cgroups are joined first. In a
joined PID namespace the command is forked into it, this process staying as its parent and ending as it
ends. Then it takes the job's uid and gid (no supplementary groups, ``no_new_privs``), never more than the
job has. With ``tty`` it makes its standard input its controlling terminal. Then it ``exec``s the command
in the job's working dir with the job's environment.

Errors are one line on standard error and exit status 126 (127: the command cannot be run). Only the
standard library and ``ctypes`` (``setns`` is not in Python 3.9); Linux only.
"""

from __future__ import annotations

import ctypes
import fcntl  # imported before the job's namespaces are joined: its root may not hold the interpreter's
import marshal
import os
import signal
import sys
import termios

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWIPC = 0x08000000
PR_SET_NO_NEW_PRIVS = 38


def _libc() -> ctypes.CDLL:
    for name in (None, "libc.so.6"):
        try:
            lib = ctypes.CDLL(name, use_errno=True)
            lib.setns  # noqa: B018 - the symbol must be there
            return lib
        except (OSError, AttributeError):
            continue
    raise OSError("cannot load the C library")


class SessionError(Exception):
    pass


def _same_ns(pid: int, kind: str) -> bool:
    return os.stat(f"/proc/{pid}/ns/{kind}").st_ino == os.stat(f"/proc/self/ns/{kind}").st_ino


def enter(spec: dict) -> None:  # type: ignore[type-arg]  # noqa: C901
    pid = spec.get("pid")
    uid, gid = spec.get("uid"), spec.get("gid")
    libc = _libc()
    for path in spec.get("cgroups") or []:  # a container's cgroups: the session is held to its limits
        try:
            with open(path, "w") as f:
                f.write(str(os.getpid()))
        except OSError:
            pass
    if pid:
        # every namespace file is opened first: joining the mount namespace hides the host's /proc
        fds = []
        # the user namespace last: joining the others takes the host's root, which a joined user namespace ends
        kinds = [("net", CLONE_NEWNET), ("ipc", CLONE_NEWIPC), ("mnt", CLONE_NEWNS)]
        if spec.get("pidns"):  # the job's /proc shows the session's processes (main() forks into it)
            kinds.append(("pid", CLONE_NEWPID))
        kinds.append(("user", CLONE_NEWUSER))
        for kind, flag in kinds:
            if not _same_ns(pid, kind):
                fds.append((kind, flag, os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY)))
        os.setgroups([])
        for kind, flag, fd in fds:
            if libc.setns(fd, flag) != 0:
                raise SessionError(f"join the job's {kind} namespace: {os.strerror(ctypes.get_errno())}")
            os.close(fd)
            if kind == "user":
                inside = spec.get("inside") or (0, 0)
                uid, gid = int(inside[0]), int(inside[1])
    if spec.get("tty"):
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    if gid is not None and uid is not None and (os.getuid(), os.getgid()) != (uid, gid):
        if os.getuid() == 0:
            os.setgroups([])
        os.setgid(int(gid))
        os.setuid(int(uid))
    if pid:
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    try:
        os.chdir(spec["cwd"])
    except OSError:
        os.chdir("/")


def main() -> None:
    spec = marshal.loads(bytes.fromhex(sys.argv[1]))
    try:
        enter(spec)
    except (SessionError, OSError, KeyError, ValueError) as e:
        os.write(2, f"corral: cannot open the session in the job: {e}\r\n".encode())
        os._exit(126)
    argv = spec["argv"]
    if spec.get("pidns") and _forked_into_pid_namespace():
        return
    try:
        os.execvpe(argv[0], argv, spec["env"])
    except OSError as e:
        os.write(2, f"corral: cannot run {argv[0]}: {e.strerror}\r\n".encode())
        os._exit(127)


def _forked_into_pid_namespace() -> bool:
    """A joined PID namespace holds only the children made after the join: fork the command into it and
    stay as its parent, ending as it ends (its status, or its signal). False in the child."""
    child = os.fork()
    if child == 0:
        return False
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGWINCH):
        signal.signal(sig, signal.SIG_IGN)  # the session's signals reach the command (same process group)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        killed = os.WTERMSIG(status)
        try:
            signal.signal(killed, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL and SIGSTOP keep their default
        os.kill(os.getpid(), killed)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


if __name__ == "__main__":
    main()
