"""The sandbox launcher: the first process of a sandboxed job, run as root, that becomes the job.

Forked, once per job, by the agent's fork server (:func:`serve`: this file's source run once per agent as
``python3 -I -S -c <source> --serve FD``, a single-threaded interpreter that never runs a thread: no fork of
the threaded agent runs Python code), or, where that server cannot start, run as a process of its own
(``python3 -I -S -c <source> <spec>``). In this order it

1. joins the job's network namespace (``setns`` on ``/run/netns/<name>``);
2. enters a mount namespace of its own (``unshare(CLONE_NEWNS)``, everything made private), so every
   mount below vanishes with the job's last process and nothing is ever left on the host;
3. builds the job's root on a tmpfs: each host directory bind-mounted read-only, nosuid (recursively),
   except the paths the job owns (``binds``: its working dir, repo dir, ``files:`` targets, ``/tmp``,
   its home), which are its own directories bound read-write, and the ``hide`` paths (the server's
   state, the agent's work dir), which are left out. Only the directories on the way to a job or
   hidden path are rebuilt level by level; ``/dev`` stays writable with a ``/dev/shm`` of the job's own;
4. makes it the root (``pivot_root``), drops to the job's uid and gid (no supplementary groups, ``no_new_privs``) --
   inside a user namespace of its own where that uid is root, or the configuration's ``user`` (the agent
   writes the one-uid mapping when asked on the status pipe) -- and ``exec``s the job's command in its
   working dir.

It reports on file descriptor ``status_fd``: ``map`` when it waits for its user mapping (the agent
answers ``g`` on ``go_fd``), then nothing (the descriptor closes on ``exec``) when the job started, else
one line saying what failed. Only the standard library, ``ctypes`` for the system calls
that Python 3.9 lacks (``setns``, ``unshare``, ``mount``, ``mount_setattr``); Linux only.
"""

from __future__ import annotations

import ctypes
import marshal
import os
import signal
import sys

TYPE_CHECKING = False  # no `typing` import: it would cost the launcher more than all its mounts
if TYPE_CHECKING:
    from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MOUNT_ATTR_RDONLY = 1
MOUNT_ATTR_NOSUID = 2
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
SYS_MOUNT_SETATTR = 442  # the same number on x86_64 and arm64
PR_SET_NO_NEW_PRIVS = 38
MNT_DETACH = 2
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}.get(os.uname().machine)


def _load_libc() -> ctypes.CDLL:
    """The C library: the interpreter's own symbols (no search: ``find_library`` would run ``ldconfig``)."""
    for name in (None, "libc.so.6"):
        try:
            lib = ctypes.CDLL(name, use_errno=True)
            lib.mount  # noqa: B018 - the symbol must be there
            return lib
        except (OSError, AttributeError):
            continue
    from ctypes.util import find_library

    return ctypes.CDLL(find_library("c") or "libc.so.6", use_errno=True)


_libc = _load_libc()


class SandboxError(Exception):
    pass


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"{what}: {os.strerror(err)}")


def _mount(src: str, target: str, fstype: str, flags: int, data: str = "") -> None:
    _check(
        _libc.mount(
            src.encode(), target.encode(), fstype.encode() or None, ctypes.c_ulong(flags), data.encode() or None
        ),
        f"mount {src} on {target}",
    )


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


_setattr_works = [True]


def _read_only(target: str) -> None:
    """Make ``target`` and every mount below it read-only and nosuid."""
    if _setattr_works[0]:
        attr = _MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
        rc = _libc.syscall(
            SYS_MOUNT_SETATTR, AT_FDCWD, target.encode(), AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)
        )
        if rc == 0:
            return
        _setattr_works[0] = False  # kernels before 5.12: one remount per mount
    prefix = target.rstrip("/") + "/"
    with open("/proc/self/mountinfo") as f:
        points = [_unescape(line.split()[4]) for line in f]
    for point in points:
        if point == target or point.startswith(prefix):
            flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID
            if _libc.mount(None, point.encode(), None, ctypes.c_ulong(flags), None) != 0:
                # a mount with locked flags (nodev, noexec) must keep them: ask again with them
                st = os.statvfs(point)
                extra = st.f_flag & (MS_NODEV | 8)  # ST_NODEV, ST_NOEXEC
                _check(_libc.mount(None, point.encode(), None, ctypes.c_ulong(flags | extra), None), f"remount {point}")


def _unescape(path: str) -> str:
    return path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _under(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip("/") + "/")


def _placeholder(target: str, is_dir: bool) -> None:
    if is_dir:
        os.makedirs(target, exist_ok=True)
    elif not os.path.lexists(target):
        open(target, "w").close()


def _bind(src: str, target: str, writable: bool) -> None:
    _placeholder(target, os.path.isdir(src))
    _mount(src, target, "", MS_BIND | MS_REC)
    if not writable:
        _read_only(target)


def _build(root: str, path: str, binds: dict[str, str], hide: list[str]) -> None:
    """Fill ``root + path`` (a directory of the tmpfs) with what the job sees at ``path``."""
    own = {p for p in binds if _under(p, path) and p != path}
    hidden = [h for h in hide if _under(h, path) and h != path]
    try:
        names = sorted(os.listdir(path))
    except OSError:
        names = []
    children = set(names)
    for p in own:  # paths the job owns that the host lacks are made here
        children.add(p[len(path.rstrip("/")) + 1 :].split("/")[0])
    for name in sorted(children):
        child = path.rstrip("/") + "/" + name
        target = root + child
        if child in hide:
            continue
        if child in binds:
            _bind(binds[child], target, True)
            continue
        deeper = any(_under(p, child) for p in own) or any(_under(h, child) for h in hidden)
        if os.path.islink(child):
            os.symlink(os.readlink(child), target)
        elif deeper and (os.path.isdir(child) or not os.path.lexists(child)):
            os.makedirs(target, exist_ok=True)
            _build(root, child, binds, hide)
        elif os.path.lexists(child):
            try:
                _bind(child, target, child == "/dev")
            except SandboxError:
                if child in ("/proc", "/sys", "/dev"):
                    raise
                # an entry that cannot be bound (a dead mount point, a socket): the job does not see it


def _enter(root: str) -> None:
    """Make ``root`` the root of the mount namespace (``pivot_root``, the old root detached: nothing of
    the host outside it stays reachable, not even for a job that is root in its user namespace and could
    leave a mere ``chroot``); ``chroot`` on an architecture whose call number is not known here."""
    os.chdir(root)
    if _PIVOT_ROOT is None:
        os.chroot(".")
        return
    _check(_libc.syscall(_PIVOT_ROOT, b".", b"."), "pivot_root into the job's root")
    _check(_libc.umount2(b".", MNT_DETACH), "detach the host's root")
    # pivot_root moves only the processes whose root was the namespace's; an agent in a chroot (a
    # container's) keeps its own until this
    os.chroot(".")
    os.chdir("/")


def setup(spec: dict[str, Any]) -> None:
    if spec.get("netns"):
        fd = os.open(spec["netns"], os.O_RDONLY)
        _check(_libc.setns(fd, CLONE_NEWNET), "join the job's network namespace")
        os.close(fd)
        # the namespace is the job's alone: any port and ping are its own (as in a container)
        for key, value in (("ip_unprivileged_port_start", "0"), ("ping_group_range", "0 2147483647")):
            try:
                with open("/proc/sys/net/ipv4/" + key, "w") as f:
                    f.write(value)
            except OSError:
                pass  # an older kernel: ports below 1024 stay root's
    _check(_libc.unshare(CLONE_NEWNS), "create the job's mount namespace")
    _mount("none", "/", "", MS_REC | MS_PRIVATE)
    root = spec["root"].rstrip("/")
    _mount("corral-root", root, "tmpfs", MS_NOSUID, "mode=0755")
    binds = {k.rstrip("/") or "/": v for k, v in spec["binds"].items()}
    hide = [h.rstrip("/") for h in spec.get("hide", []) if h.rstrip("/")]
    outer = {p: h for p, h in binds.items() if not any(q != p and _under(p, q) for q in binds)}
    _build(root, "/", outer, hide)
    for path in sorted(set(binds) - set(outer), key=len):  # an instance volume inside the job's own paths
        _bind(binds[path], root + path, True)
    if os.path.isdir(root + "/dev"):
        os.makedirs(root + "/dev/shm", exist_ok=True)
        _mount("shm", root + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    _mount("none", root, "", MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
    _enter(root)
    uid, gid = int(spec["uid"]), int(spec["gid"])
    os.setgroups([])
    inside = spec.get("inside")
    if inside is not None:
        # a user namespace where the job's uid is ``inside`` (root by default, as in a container): the
        # agent, root outside, writes the mapping once this process is in it
        if _libc.unshare(CLONE_NEWUSER) == 0:
            os.write(int(spec["status_fd"]), b"map\n")
            go = int(spec["go_fd"])
            if os.read(go, 1) != b"g":
                raise SandboxError("the agent did not map the job's user")
            os.close(go)
            uid, gid = int(inside[0]), int(inside[1])
        elif list(inside) != [0, 0]:
            # the kernel refuses user namespaces to an agent that itself runs in a chroot
            raise SandboxError(f"cannot create the user namespace for `user`: {os.strerror(ctypes.get_errno())}")
        # else: the job runs as its own uid, not as root inside
    os.setgid(gid)
    os.setuid(uid)
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "set no_new_privs")
    os.chdir(spec["cwd"])


def launch(spec: dict[str, Any]) -> None:
    """Set the job up (:func:`setup`) and ``exec`` it; never returns. Failures are reported on ``status_fd``."""
    status = int(spec["status_fd"])
    try:
        setup(spec)
    except (SandboxError, OSError, KeyError, ValueError) as e:
        os.write(status, f"{e}\n".encode())
        os._exit(126)
    argv = spec["argv"]
    os.set_inheritable(status, False)
    # the job gets the signals' defaults, not what Python set for itself (SIGPIPE and SIGXFSZ ignored)
    for name in ("SIGPIPE", "SIGXFSZ", "SIGCHLD"):
        sig = getattr(signal, name, None)
        if sig is not None:
            signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvpe(argv[0], argv, dict(os.environ))
    except OSError as e:
        os.write(status, f"cannot run {argv[0]}: {e.strerror}\n".encode())
        os._exit(127)


def main() -> None:
    if sys.argv[1] == "--serve":
        serve(int(sys.argv[2]))
        return
    launch(marshal.loads(bytes.fromhex(sys.argv[1])))  # built by the agent; marshal needs no import


# ---- the fork server ----------------------------------------------------------------------------------
# One launcher started once per agent (``--serve FD``) that forks a child per job instead of a fresh
# interpreter per job (about 15 ms of CPU each). It stays single-threaded: every job is a fork of a process
# that never ran a thread. On the SOCK_SEQPACKET socket ``FD`` the agent sends one message per job,
# marshal of {"id", "spec", "env", "cwd"} with five descriptors (stdin, stdout, stderr, the status pipe's
# write end, the go pipe's read end); the server answers ("pid", id, pid) once the child is forked and
# ("exit", pid, wait status) when it ends (it is the job's parent, so the one to reap it). It exits when
# the agent's end of the socket closes; the jobs it started run on, as a stopped agent's do.


def _child(sock: int, wake: tuple[int, int], req: dict[str, Any], fds: list[int]) -> None:
    try:
        signal.set_wakeup_fd(-1)
        for fd in (sock, *wake):
            os.close(fd)
        os.setsid()
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        for fd in fds[:3]:
            if fd > 2:
                os.close(fd)
        spec = dict(req["spec"])
        spec["status_fd"], spec["go_fd"] = fds[3], fds[4]
        os.set_inheritable(fds[4], False)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
    except BaseException as e:  # the child must never return into the server's loop
        try:
            os.write(fds[3], f"cannot start the job: {e}\n".encode())
        finally:
            os._exit(126)
    try:
        launch(spec)
    finally:
        os._exit(126)


def serve(sock: int) -> None:  # noqa: C901
    import select
    import socket

    os.set_inheritable(sock, False)
    conn = socket.socket(fileno=sock)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wake-up fd hears of each child
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the agent's terminal's ^C is the agent's to handle
    while True:
        ready = select.select([conn.fileno(), wake_r], [], [])[0]
        if conn.fileno() in ready:
            try:
                msg, fds, _flags, _addr = socket.recv_fds(conn, 1 << 22, 5)
            except OSError:
                msg, fds = b"", []
            if not msg:
                return  # the agent is gone
            req = marshal.loads(msg)
            try:
                pid = os.fork()
            except OSError as e:
                pid = -1
                os.write(fds[3], f"cannot fork the job's launcher: {e}\n".encode())
            if pid == 0:
                _child(conn.fileno(), (wake_r, wake_w), req, fds)
            for fd in fds:
                os.close(fd)
            conn.send(marshal.dumps(("pid", req["id"], pid)))
        if wake_r in ready:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
        while True:  # every child that ended (also when only a request woke the loop)
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn.send(marshal.dumps(("exit", pid, status)))


if __name__ == "__main__":
    main()
