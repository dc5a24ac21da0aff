"""The sandbox launcher: the process of a sandboxed job that the agent knows, run as root, and the job's
init, which sets the job up and starts its command.

Forked, once per job, by the agent's fork server (:func:`serve`: this file's source run once per agent as
``python3 -I -S -c <source> --serve FD``, a single-threaded interpreter that never runs a thread: no fork of
the threaded agent runs Python code), or, where that server cannot start, run as a process of its own
(``python3 -I -S -c <source> <spec>``). The fork server forks each job's init straight into a PID
namespace of its own (``unshare(CLONE_NEWPID)`` before the fork), where it is PID 1; a launcher of its own
makes that namespace and forks the init into it, staying outside as the job's process for the agent (its pid
the job's process group and session), ignoring the signals the agent sends the job's group and ending as
the job's command ends (its status or its signal). The init, in this order,

1. joins the job's network namespace (``setns`` on ``/run/netns/<name>``);
2. enters a mount namespace and an IPC namespace of its own (``unshare(CLONE_NEWNS | CLONE_NEWIPC)``,
   every mount made private), so every mount below vanishes with the job's last process and nothing is
   ever left on the host, and no SysV or POSIX IPC object of another process is reachable;
3. builds the job's root on a tmpfs: each host directory bind-mounted read-only, nosuid (recursively),
   except the paths the job owns (``binds``: its working dir, repo dir, ``files:`` targets, ``/tmp``,
   its home), which are its own directories bound read-write, and the ``hide`` paths (the server's
   state, the agent's work dir), which are left out. Only the directories on the way to a job or
   hidden path are rebuilt level by level; ``/dev`` stays writable with a ``/dev/shm`` and a
   ``/dev/mqueue`` of the job's own, and ``/proc`` is a procfs of the job's PID namespace (it lists the
   job's processes only);
4. makes it the root (``pivot_root``), drops to the job's uid and gid (no supplementary groups, ``no_new_privs``) --
   inside a user namespace of its own where that uid is root, or the configuration's ``user`` (the agent
   writes the one-uid mapping when asked on the status pipe) -- starts the job's command (PID 2) in its
   working dir (``posix_spawn``), and reaps every process of the namespace until the command ends.

It reports on file descriptor ``status_fd``: ``pid N`` (the init's pid on the host), ``map`` when it waits
for its user mapping (the agent answers ``g`` on ``go_fd``), then nothing (the descriptor closes on the
command's ``exec``) when the job started, else one line saying what failed. Only the standard library,
``ctypes`` for the system calls that Python 3.9 lacks (``setns``, ``unshare``, ``mount``,
``mount_setattr``, ``prctl``); Linux only.
"""

from __future__ import annotations

import ctypes
import marshal
import os
import resource
import select  # imported before the job's root hides the interpreter's modules from its init
import signal
import sys

TYPE_CHECKING = False  # no `typing` import: it would cost the launcher more than all its mounts
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWIPC = 0x08000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
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
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NAME = 15
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
        if child == "/proc":  # the job's PID namespace's own, mounted by its init (this process)
            os.makedirs(target, exist_ok=True)
            _mount("proc", target, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
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
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWIPC), "create the job's mount and IPC namespaces")
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
    if os.path.isdir(root + "/dev/mqueue"):  # the POSIX message queues of the job's IPC namespace
        try:
            _mount("mqueue", root + "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        except SandboxError:
            pass  # a kernel without them: mq_open fails in the job as on such a host
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


def launch(spec: dict[str, Any], report: Callable[[int], object] | None = None) -> None:
    """Start the job in a PID namespace of its own; never returns. Forked by the fork server, this process
    is already PID 1 of the job's namespace: it is the job's init (:func:`_init`), which reports the
    command's wait status with ``report``. Started on its own, it makes the namespace and stays outside it
    as the job's process for the agent (:func:`_outside`), its child the init. Failures are reported on
    ``status_fd``."""
    if report is not None:
        _init(spec, report, None)
        return
    status = int(spec["status_fd"])
    try:
        # CLONE_NEWPID applies to the children made after it: the next fork is PID 1 of the job's namespace
        _check(_libc.unshare(CLONE_NEWPID), "create the job's PID namespace")
        report_r, report_w = os.pipe()
        init = os.fork()
    except (SandboxError, OSError) as e:
        os.write(status, f"{e}\n".encode())
        os._exit(126)
    if init == 0:
        try:
            os.close(report_r)
            _init(spec, lambda st: os.write(report_w, str(st).encode()), report_w)
        finally:
            os._exit(126)
    os.close(report_w)
    os.close(status)
    os.close(int(spec["go_fd"]))
    _outside(init, report_r)


def _init(spec: dict[str, Any], report: Callable[[int], object], parent: int | None) -> None:
    """PID 1 of the job's namespace: set the job up, start its command, reap every process the namespace
    hands it, and when the command ends ``report`` its wait status and exit (the kernel then kills whatever
    the job left in the namespace). It has no signal handler, so the kernel gives it no signal but a
    SIGKILL from outside; the job's signals reach the job directly (the agent signals the process group,
    which the job's processes share with this one). With ``parent`` (the write end of a pipe its parent
    reads: a launcher of its own, outside the namespace) it dies with that parent."""
    status = int(spec["status_fd"])
    try:
        # the host's /proc, still mounted here, names this process as the host sees it: the agent maps its
        # user namespace and sessions join its namespaces by this pid
        os.write(status, f"pid {os.readlink('/proc/self')}\n".encode())
        _rename(b"corral-init")
        setup(spec)
        # after the last change of credentials, which clears both: the job (the same uid) can neither read
        # this process's memory nor trace it, and it dies with a launcher of its own
        _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        if parent is not None:
            _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "set the parent's death signal")
            if _reader_gone(parent):
                os._exit(126)  # the parent died before the death signal was set
        try:
            os.close(int(spec["go_fd"]))  # if the user mapping did not close it
        except OSError:
            pass
        # the job gets the signals' defaults, not what Python set for itself (SIGPIPE and SIGXFSZ ignored,
        # SIGINT and SIGCHLD handled) or the fork server (SIGINT ignored)
        for name in ("SIGPIPE", "SIGXFSZ", "SIGCHLD", "SIGINT"):
            sig = getattr(signal, name, None)
            if sig is not None:
                signal.signal(sig, signal.SIG_DFL)
        os.set_inheritable(status, False)  # it closes as the command starts: the agent's sign that it runs
        argv = spec["argv"]
    except Exception as e:  # whatever stops the job is said on the status pipe
        os.write(status, f"{e}\n".encode())
        os._exit(126)
    try:
        # a vfork and exec (posix_spawn): no copy of this interpreter's memory for a process that only execs
        # its environment: the agent's request's (a fork of the fork server), else this process's own (a launcher
        # of its own, started with the job's environment)
        job = os.posix_spawnp(argv[0], argv, spec["env"] if "env" in spec else dict(os.environ))
    except OSError as e:
        os.write(status, f"cannot run {argv[0]}: {e.strerror}\n".encode())
        os._exit(127)
    os.close(status)
    while True:
        try:
            pid, st = os.wait()
        except ChildProcessError:
            os._exit(126)
        if pid == job:
            break
    report(st)
    os._exit(0)


def _rename(name: bytes) -> None:
    """What ``ps`` in the job shows for its PID 1: ``name``, not the launcher's command line (the fork server's
    ``python3 -I -S -c <source> --serve FD``, or in the fallback its spec): its name (``ps -e``) and its command
    line (``ps -ef``, ``/proc/1/cmdline``). The command line is this process's original argv area, rewritten
    in place as ``setproctitle`` does, with no privilege (``PR_SET_MM`` would take CAP_SYS_RESOURCE). This
    fork's own copy of that memory: the fork server's command line stays as it was. Best effort."""
    _libc.prctl(PR_SET_NAME, name, 0, 0, 0)
    try:
        stat = os.open("/proc/self/stat", os.O_RDONLY)
        try:
            fields = os.read(stat, 4096).rsplit(b")", 1)[1].split()  # from field (3) on: the name may hold anything
        finally:
            os.close(stat)
        # (48) arg_start and (49) arg_end: the addresses above and below which the command-line arguments (argv)
        # are placed (proc_pid_stat(5), https://man7.org/linux/man-pages/man5/proc_pid_stat.5.html)
        start, end = int(fields[48 - 3]), int(fields[49 - 3])
        if end - start < len(name) + 2:
            return
        # the name, NUL, NULs, and a last byte that is not NUL: the kernel then reads the command line up to its
        # first NUL, "the user has overwritten it with setproctitle(3)" (Linux's fs/proc/base.c, get_mm_cmdline,
        # https://github.com/torvalds/linux/blob/master/fs/proc/base.c)
        title = name + b"\0" * (end - start - len(name) - 1) + b" "
        # /proc/self/mem takes a ptrace access check, which a process always passes for itself (proc_pid_mem(5),
        # https://man7.org/linux/man-pages/man5/proc_pid_mem.5.html; ptrace(2), "Ptrace access mode checking")
        mem = os.open("/proc/self/mem", os.O_WRONLY)
        try:
            os.pwrite(mem, title, start)
        finally:
            os.close(mem)
    except (OSError, ValueError, IndexError):
        pass


def _reader_gone(fd: int) -> bool:
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poll.poll(0))


def _outside(init: int, report: int) -> None:
    """The job's process for the agent (and its fork server, which reaps it): it waits for the namespace's
    init and ends as the job's command did, with its exit status or by its signal."""
    for sig in signal.valid_signals():  # the agent signals the whole group: only the job acts on it
        if sig not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            try:
                signal.signal(sig, signal.SIG_IGN)
            except (OSError, ValueError):
                pass
    while True:
        try:
            _, st = os.waitpid(init, 0)
            break
        except ChildProcessError:
            os._exit(126)
    words = os.read(report, 64)
    if words:
        st = int(words)
    if os.WIFSIGNALED(st):
        killed = os.WTERMSIG(st)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the job's signal, not a core of this process
        if killed != signal.SIGKILL:
            signal.signal(killed, signal.SIG_DFL)
        os.kill(os.getpid(), killed)
        os._exit(128 + killed)
    os._exit(os.WEXITSTATUS(st) if os.WIFEXITED(st) else 126)


def main() -> None:
    if sys.argv[1] == "--serve":
        serve(int(sys.argv[2]))
        return
    launch(marshal.loads(bytes.fromhex(sys.argv[1])))  # built by the agent; marshal needs no import


# ---- the fork server ----------------------------------------------------------------------------------
# One launcher started once per agent (``--serve FD``) that forks a child per job instead of a fresh
# interpreter per job (about 15 ms of CPU each). It stays single-threaded: every job is a fork of a process
# that never ran a thread. On the SOCK_SEQPACKET socket ``FD`` the agent sends one message per job,
# marshal of {"id", "spec", "env", "cwd"} with six descriptors (stdin, stdout, stderr, the status pipe's
# write end, the go pipe's read end, the report pipe's write end); the server forks the job's init into a
# PID namespace of its own and answers ("pid", id, pid) once it is forked and ("exit", pid, wait status) when
# it ends (it is the init's parent, so the one to reap it). The init writes the wait status of the job's
# command on the report pipe before it ends. The server exits when the agent's end of the socket closes; the
# jobs it started run on, as a stopped agent's do.


def _child(sock: int, wake: tuple[int, int], req: dict[str, Any], fds: list[int]) -> None:
    """The job's init, PID 1 of its namespace: it writes the wait status of the job's command on the sixth
    descriptor (the report pipe, which the agent reads once the server says the init ended)."""
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
        for fd in fds[4:6]:
            os.set_inheritable(fd, False)  # not the job's command's
        os.chdir(req["cwd"])
        # the job's environment is the command's (posix_spawn's argument), not this process's: rebuilding
        # ``os.environ`` (an unsetenv per variable of the agent's, a putenv per one of the job's) cost this fork
        # more than half a millisecond of CPU. Only PATH, which posix_spawnp searches in this process's
        # environment, is set here.
        spec["env"] = req["env"]
        if "PATH" in req["env"]:
            os.environ["PATH"] = req["env"]["PATH"]
        else:
            os.environ.pop("PATH", None)
    except BaseException as e:  # the child must never return into the server's loop
        try:
            os.write(fds[3], f"cannot start the job: {e}\n".encode())
        finally:
            os._exit(126)
    try:
        launch(spec, lambda st: os.write(fds[5], str(st).encode()))
    finally:
        os._exit(126)


def _fork_into_namespace(own: int, status: int) -> int:
    """Fork the job's init as PID 1 of a PID namespace of its own (-1: it failed, as said on ``status``); the
    server goes on making its children in its own namespace (``own``)."""
    if _libc.unshare(CLONE_NEWPID) != 0:
        os.write(status, f"create the job's PID namespace: {os.strerror(ctypes.get_errno())}\n".encode())
        return -1
    try:
        pid = os.fork()
    except OSError as e:
        pid = -1
        os.write(status, f"cannot fork the job's init: {e}\n".encode())
    if pid != 0:
        _check(_libc.setns(own, CLONE_NEWPID), "return to the fork server's PID namespace")
    return pid


def serve(sock: int) -> None:
    import gc
    import socket

    # No collection in this server or in the inits it forks: a collection walks every object, and in a fork
    # each object it walks is a page copied from this server's memory. This loop makes no cyclic garbage (one
    # message, one fork, one reply), and an init lives on only to reap its job.
    gc.disable()
    gc.freeze()
    os.set_inheritable(sock, False)
    own = os.open("/proc/self/ns/pid", os.O_RDONLY)  # this server's PID namespace, which each job's is made in
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
                msg, fds, _flags, _addr = socket.recv_fds(conn, 1 << 22, 6)
            except OSError:
                msg, fds = b"", []
            if not msg:
                return  # the agent is gone
            req = marshal.loads(msg)
            pid = _fork_into_namespace(own, fds[3])
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
