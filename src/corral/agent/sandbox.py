"""The job sandbox: every host-process job (no ``image``) in network, mount and uid isolation of its own.

Owns, per host, the *slots* (one per sandboxed job; slot ``n`` gives the job the address ``n + 2`` of
the sandbox subnet and the uid ``n`` of ``CORRAL_JOB_UID_RANGE``), shared by every agent on the host
through records in a state directory (``/run/corral-sandbox``: gone at reboot, like what it describes)
under an ``flock``; and, per job, its :class:`JobSandbox`: the network namespace and veth
(:mod:`corral.agent.sandbox_net`), the port relays (:mod:`corral.agent.portfwd`) and the command line
that starts the job through the launcher (:mod:`corral.agent.sandbox_exec`: mount namespace, read-only
host, the job's own paths at the absolute places the configuration names, its uid).

Why subprocesses and ctypes rather than ``os.unshare``: the agent runs on Python 3.9 (3.12 added it), and
the namespaces must be entered by a single-threaded process that then ``exec``s the job, never by a fork
of the threaded agent. ``ip`` and ``iptables``/``nft`` set up the network; the launcher, which needs only
``ctypes`` for ``setns``/``unshare``/``mount``, is a fork of the agent's launcher server (a ``python3 -I -S``
started once: :mod:`corral.agent.launcher_server`), or a fresh ``python3 -I -S`` where that cannot start.

Without root, or with a tool missing, :attr:`Sandboxes.reason` says why, the agent logs it at start,
every job's ``JobState.sandbox.message`` repeats it, and jobs run as plain host processes as before.

Nothing is left behind: a job's namespace and veth go when it ends (its mounts with its last process), or
become the agent's spare for its next job when the job left nothing in them (:mod:`corral.agent.sandbox_spare`,
given back a moment after the agent's last job), the bridge and its rules when the last slot of the host is
released, and an agent that starts again (after a crash or ``kill -9``) releases every slot recorded for its
work dir whose job no longer runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import itertools
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from . import sandbox_net, slot_owner
from .launcher_server import LauncherServer
from .portfwd import Forwarder
from .sandbox_launch import Launching
from .sandbox_launch import Pipes as Pipes  # named here too, where the agent has always found them
from .sandbox_launch import SandboxError as SandboxError
from .sandbox_launch import start as start
from .sandbox_spare import SPARE_JOB, SpareNetwork

log = logging.getLogger("corral.agent")

DEFAULT_UID_RANGE = (200000, 265535)
DEFAULT_SUBNET = "10.247.0.0/16"
DEFAULT_BRIDGE = "corral0"
DEFAULT_STATE_DIR = "/run/corral-sandbox"
#: dstack's working dir in a container, and so in a sandbox when the configuration names none
DEFAULT_WORKING_DIR = "/workflow"
MODES = ("auto", "on", "off")
#: How long the bridge outlives the host's last sandbox: jobs that follow each other keep one bridge.
BRIDGE_LINGER_S = 1.0


def parse_uid_range(text: str) -> tuple[int, int]:
    try:
        lo_s, hi_s = text.split("-")
        lo, hi = int(lo_s), int(hi_s)
    except ValueError:
        raise ValueError(f"CORRAL_JOB_UID_RANGE: {text!r} is not a range like 200000-265535") from None
    if not 0 < lo <= hi < 2**32 - 1:
        raise ValueError(f"CORRAL_JOB_UID_RANGE: {text!r}: expected 0 < first <= last < 4294967295")
    return lo, hi


@dataclass(frozen=True)
class SandboxConfig:
    mode: str = "auto"
    uid_range: tuple[int, int] = DEFAULT_UID_RANGE
    subnet: str = DEFAULT_SUBNET
    bridge: str = DEFAULT_BRIDGE
    state_dir: str = DEFAULT_STATE_DIR
    #: host paths no job may see (besides the agent's work dir): the server's state directory
    hide: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, environ: dict[str, str], mode: str = "auto", hide: tuple[str, ...] = ()) -> SandboxConfig:
        """``CORRAL_JOB_UID_RANGE``, ``CORRAL_SANDBOX_SUBNET``, ``CORRAL_SANDBOX_BRIDGE``,
        ``CORRAL_SANDBOX_STATE_DIR``, ``CORRAL_SANDBOX_HIDE`` (``:``-separated); ValueError names the bad one."""
        if mode not in MODES:
            raise ValueError(f"--sandbox: {mode!r} is not one of auto, on, off")
        uids = parse_uid_range(environ["CORRAL_JOB_UID_RANGE"]) if environ.get("CORRAL_JOB_UID_RANGE") else None
        subnet = environ.get("CORRAL_SANDBOX_SUBNET") or DEFAULT_SUBNET
        try:
            net = ipaddress.IPv4Network(subnet)
        except ValueError as e:
            raise ValueError(f"CORRAL_SANDBOX_SUBNET: {subnet!r}: {e}") from None
        if net.num_addresses < 8:
            raise ValueError(f"CORRAL_SANDBOX_SUBNET: {subnet!r} is too small (at least a /29)")
        extra = tuple(p for p in (environ.get("CORRAL_SANDBOX_HIDE") or "").split(":") if p)
        return cls(
            mode=mode,
            uid_range=uids or DEFAULT_UID_RANGE,
            subnet=str(net),
            bridge=environ.get("CORRAL_SANDBOX_BRIDGE") or DEFAULT_BRIDGE,
            state_dir=environ.get("CORRAL_SANDBOX_STATE_DIR") or DEFAULT_STATE_DIR,
            hide=tuple(os.path.abspath(p) for p in (*hide, *extra)),
        )


def probe(config: SandboxConfig) -> str | None:
    """Why jobs cannot get a sandbox on this host, or None when they can."""
    if config.mode == "off":
        return "the sandbox is turned off (--sandbox off)"
    if not sys.platform.startswith("linux"):
        return f"the sandbox needs Linux (this host runs {sys.platform})"
    if os.geteuid() != 0:
        return "the agent does not run as root, so it cannot create namespaces or give jobs uids of their own"
    missing = sandbox_net.missing_tools()
    if missing:
        return "missing on this host: " + ", ".join(missing) + " (install iproute2 and iptables)"
    if not os.path.exists("/proc/self/ns/net"):
        return "this kernel has no network namespaces"
    return None


@dataclass
class JobSandbox:
    slot: int
    #: None when the job keeps the host's network
    address: str | None
    uid: int
    netns: str | None
    #: whether the job gets a user namespace (where it is root, or its ``user``)
    userns: bool = False
    forwarders: dict[int, Forwarder] = field(default_factory=dict)
    #: The job whose slot it is (its record's ``job_id``).
    job_id: str = ""

    def ports(self) -> dict[int, int]:
        return {p: f.port for p, f in self.forwarders.items()}


class Sandboxes(Launching, SpareNetwork):
    """The slots of this host and the sandboxes of this agent's jobs."""

    def __init__(self, work_dir: str, config: SandboxConfig) -> None:
        self.work_dir = os.path.abspath(work_dir)
        self.config = config
        self.network = ipaddress.IPv4Network(config.subnet)
        lo, hi = config.uid_range
        self.size = min(hi - lo + 1, self.network.num_addresses - 3)
        self.reason = probe(config)
        self.userns = _user_namespaces()
        self._helper: str | None = None
        self._server: LauncherServer | None = None
        self._timer_lock = threading.Lock()
        self._spare_lock = threading.Lock()
        self._spare: tuple[int, str] | None = None
        self._no_spares = False
        self._bridge_timer: threading.Timer | None = None

    @property
    def available(self) -> bool:
        return self.reason is None

    # ---- slots (host-wide, under the lock) ------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[str]:
        slots = os.path.join(self.config.state_dir, "slots")
        os.makedirs(slots, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(self.config.state_dir, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield slots
        finally:
            os.close(fd)

    @staticmethod
    def _records(slots: str) -> dict[int, dict[str, Any]]:
        out = {}
        for name in os.listdir(slots):
            if name.endswith(".json") and name[:-5].isdigit():
                try:
                    with open(os.path.join(slots, name)) as f:
                        out[int(name[:-5])] = json.load(f)
                except (OSError, ValueError):
                    out[int(name[:-5])] = {}
        return out

    def address(self, slot: int) -> str:
        return str(self.network.network_address + 2 + slot)

    def uid(self, slot: int) -> int:
        return self.config.uid_range[0] + slot

    def reserve(self, job_id: str) -> int:
        """The job's slot: the one already recorded for it, else the lowest free one (one whose last job's veth
        is gone, if there is one)."""
        with self._locked() as slots:
            return self._reserve(slots, job_id)

    def _reserve(self, slots: str, job_id: str) -> int:
        records = self._records(slots)
        for n, rec in records.items():
            if rec.get("work_dir") == self.work_dir and rec.get("job_id") == job_id:
                return n
        # a free slot whose last job's veth the kernel has removed already (else its next job waits for that)
        free = (n for n in range(self.size) if n not in records)
        settled = (n for n in range(self.size) if n not in records and not sandbox_net.veth_exists(n))
        for n in itertools.chain(itertools.islice(settled, 1), itertools.islice(free, 1)):
            with open(os.path.join(slots, f"{n}.json"), "x") as f:
                rec = {"work_dir": self.work_dir, "job_id": job_id, "mnt": _mount_ns(), "since": time.time()}
                f.write(json.dumps({**rec, **slot_owner.owner()}))
            return n
        raise SandboxError(f"all {self.size} sandbox slots of this host are taken (CORRAL_JOB_UID_RANGE)")

    def _release(self, slots: str, slot: int, bridge: bool = True) -> None:
        """Give back ``slot`` (the lock held): its uid's processes killed, its namespace and veth gone; the bridge
        and its rules too if it was the host's last slot (unless ``bridge`` is False: :meth:`bridge_down_if_idle`
        later)."""
        kill_uid(self.uid(slot))  # what the job left running outside its process group
        sandbox_net.job_net_down(slot)
        self._forget_slot(slots, slot, bridge)

    def _forget_slot(self, slots: str, slot: int, bridge: bool) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(slots, f"{slot}.json"))
        if bridge and not self._records(slots):
            self._bridge_down()

    def _bridge_up(self) -> None:
        """The bridge and its rules, unless this host's agents already put them up (the lock held): a marker in
        the state directory, written once they are up and removed before they go, says so -- for the network
        namespace it names (an agent in a container of its own network may share the state directory)."""
        marker = os.path.join(self.config.state_dir, "bridge")
        mine = f"{self.config.bridge} {self.network} {_net_ns()}\n"
        try:
            with open(marker) as f:
                if f.read() == mine and sandbox_net.bridge_exists(self.config.bridge):
                    return
        except OSError:
            pass
        sandbox_net.bridge_up(self.config.bridge, self.network)
        with open(marker, "w") as f:
            f.write(mine)

    def _bridge_down(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.config.state_dir, "bridge"))
        sandbox_net.bridge_down(self.config.bridge, self.network)

    def bridge_down_if_idle(self) -> None:
        """The bridge and its NAT rules removed if no slot of the host is taken (a job that started meanwhile
        keeps them). A job's end asks for it :data:`BRIDGE_LINGER_S` after the job is seen finished
        (:meth:`bridge_down_later`): the teardown (two processes, tens of ms) is then off the path from the job's
        exit to its end, and a host whose jobs follow each other keeps one bridge instead of one per job."""
        if not self.available:
            return
        with self._locked() as slots:
            if not self._records(slots):
                self._bridge_down()

    def bridge_down_later(self, delay: float = BRIDGE_LINGER_S) -> None:
        """:meth:`bridge_down_if_idle` in ``delay`` seconds (one pending check per agent: a later call moves it)."""
        if not self.available:
            return
        with self._timer_lock:
            if self._bridge_timer is not None:
                self._bridge_timer.cancel()
            timer = self._bridge_timer = threading.Timer(delay, self._bridge_check)
            timer.daemon = True
            timer.start()

    def _bridge_check(self) -> None:
        try:
            self.release_spare_if_idle()
            self.bridge_down_if_idle()
        except OSError:
            log.exception("cannot remove the sandbox bridge")

    def cancel_bridge_check(self) -> None:
        """Forget a pending :meth:`bridge_down_later` (the agent's shutdown does the check itself: ``reap``)."""
        with self._timer_lock:
            if self._bridge_timer is not None:
                self._bridge_timer.cancel()
                self._bridge_timer = None

    def release(self, job_id: str) -> None:
        """Give back the slot reserved for a job that never ran in it (it is forgotten)."""
        if not self.available:
            return
        with self._locked() as slots:
            for n, rec in self._records(slots).items():
                if rec.get("work_dir") == self.work_dir and rec.get("job_id") == job_id:
                    self._release(slots, n)

    def release_stale(self, known: set[str], max_age: float = 600.0) -> None:
        """Give back this agent's slots reserved over ``max_age`` ago for jobs it never got (a run stopped
        between the reservation of its nodes' addresses and their submission)."""
        if not self.available:
            return
        cutoff = time.time() - max_age
        with self._locked() as slots:
            for n, rec in self._records(slots).items():
                mine = rec.get("work_dir") == self.work_dir
                if mine and rec.get("job_id") not in known and float(rec.get("since") or 0) < cutoff:
                    self._release(slots, n)

    def reap(self, live: set[str]) -> int:
        """After a start: release this agent's slots whose job is not ``live``, slots of agents whose
        work dir is gone, and namespaces no record claims. Returns how many were released."""
        if not self.available:
            return 0
        released = 0
        with self._locked() as slots:
            records = self._records(slots)
            for n, rec in records.items():
                mine = rec.get("work_dir") == self.work_dir
                # an agent whose work dir is gone (seen from the same mount namespace: a host's agents, not
                # those of a container or chroot that shares the state dir)
                gone = rec.get("mnt") == _mount_ns() and not os.path.isdir(str(rec.get("work_dir")))
                gone = gone and not slot_owner.running(rec)  # an agent still ending gives its slots back itself
                if (mine and rec.get("job_id") not in live) or gone:
                    self._release(slots, n)
                    released += 1
            for n in sandbox_net.leftover_slots():
                if n not in records:
                    sandbox_net.job_net_down(n)
                    released += 1
            if not self._records(slots):
                self._bridge_down()
        if SPARE_JOB not in live:
            self.forget_spare()  # its slot was this agent's and not live: given back above
        return released

    # ---- one job's sandbox ----------------------------------------------------------------------
    def mount_point(self) -> str:
        """Where a job's root is mounted: in the job's own mount namespace, so one directory serves every job of
        the agent (none is made per job)."""
        path = os.path.join(self.work_dir, "sandbox-root")
        os.makedirs(path, exist_ok=True)
        return path

    def open(self, job_id: str, ports: list[int], host_network: bool = False) -> JobSandbox:
        """The job's slot, network (its slot's address, the bridge up if it is the first) and port relays;
        with ``host_network`` only the slot (its uid).

        The host's lock is held only to reserve the slot (and bring the bridge up): the job's own namespace and
        veth are made after, as the slot's record (which exists first and goes last) keeps every other agent
        off them, so that one agent's set-up never waits for another's."""
        spare = None if host_network else self.take_spare(job_id)
        try:
            if spare is not None:
                slot, netns = spare
            else:
                slot, netns = self._open_network(job_id, host_network)
        except (sandbox_net.NetError, OSError) as e:
            raise SandboxError(f"cannot set up the job's network: {e}") from None
        if not netns:
            return JobSandbox(
                slot=slot, address=None, uid=self.uid(slot), netns=None, userns=self.userns, job_id=job_id
            )
        address = self.address(slot)
        sb = JobSandbox(slot=slot, address=address, uid=self.uid(slot), netns=netns, userns=self.userns, job_id=job_id)
        try:
            for port in ports:
                sb.forwarders[port] = Forwarder(address, port)
        except OSError as e:
            self.close(sb)
            raise SandboxError(f"cannot listen for the job's port: {e}") from None
        return sb

    def _open_network(self, job_id: str, host_network: bool) -> tuple[int, str]:
        """The job's slot and its namespace (none with ``host_network``: an empty path)."""
        with self._locked() as slots:
            slot = self._reserve(slots, job_id)
            if host_network:
                return slot, ""
            try:
                self._bridge_up()
            except sandbox_net.NetError:
                self._forget_slot(slots, slot, bridge=True)
                raise
        try:
            return slot, sandbox_net.job_net_up(slot, self.address(slot), self.config.bridge, self.network)
        except sandbox_net.NetError:
            sandbox_net.job_net_down(slot)
            with self._locked() as slots:
                self._forget_slot(slots, slot, bridge=True)
            raise

    def quiesce(self, sb: JobSandbox) -> None:
        """The job's port relays closed and every process of its uid killed, its slot and network kept
        (:meth:`close` releases them): what a job's end must do before the job is reported finished."""
        for fwd in sb.forwarders.values():
            fwd.close()
        sb.forwarders.clear()
        kill_uid(sb.uid)

    def close(self, sb: JobSandbox, keep_bridge: bool = False, quiesced: bool = False) -> None:
        """Release the job's sandbox: its namespace removed outside the host's lock, then its slot under it,
        both only while the slot is still the job's (else it was given back meanwhile and may be another
        job's now, of this host's other agents too; the job's ``forget`` waits for this, so that it does not
        give the slot back in between). With ``keep_bridge`` the caller calls :meth:`bridge_down_if_idle` (or
        :meth:`bridge_down_later`) after; with ``quiesced`` it called :meth:`quiesce` already."""
        if not quiesced:
            self.quiesce(sb)
        with self._locked() as slots:
            if not self._holds(sb, self._record(slots, sb.slot)):
                return
        if sb.netns is not None:
            sandbox_net.job_net_down(sb.slot, wait=False)  # the slot's next job deletes a veth still there
        with self._locked() as slots:
            if self._holds(sb, self._record(slots, sb.slot)):
                self._forget_slot(slots, sb.slot, bridge=not keep_bridge)


def _user_namespaces() -> bool:
    """Whether this kernel lets the agent give jobs user namespaces (else a job runs as its uid only)."""
    try:
        with open("/proc/sys/user/max_user_namespaces") as f:
            return int(f.read().strip() or 0) > 0
    except (OSError, ValueError):
        return os.path.exists("/proc/self/ns/user")


def _net_ns() -> str:
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return ""


def _mount_ns() -> str:
    try:
        return os.readlink("/proc/self/ns/mnt")
    except OSError:
        return ""


def kill_uid(uid: int) -> int:
    """SIGKILL every process of ``uid`` (a slot's uid is the job's alone); returns how many."""
    killed = 0
    for _ in range(3):
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    if os.stat("/proc/" + name).st_uid == uid:
                        found.append(int(name))
                except OSError:
                    continue
        if not found:
            break
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        killed += len(found)
        time.sleep(0.02)
    return killed


def chown_tree(path: str, uid: int) -> None:
    """Give the job's own files to its uid (its directory was written by the agent, as root)."""
    os.lchown(path, uid, uid)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, uid)


def inside_ids(user: str | None) -> tuple[int, int]:
    """The uid and gid a job sees itself as: root, or its ``user`` (``name``, ``uid``, ``name:group``,
    ``uid:gid``; names as this host's ``/etc/passwd`` and ``/etc/group`` give them, which the job sees)."""
    if not user:
        return 0, 0
    import grp
    import pwd

    name, _, group = user.partition(":")
    try:
        pw = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
        uid, gid = pw.pw_uid, pw.pw_gid
    except KeyError:
        if not name.isdigit():
            raise SandboxError(f"`user: {user}`: there is no user {name!r} on this host") from None
        uid = gid = int(name)
    if group:
        try:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        except KeyError:
            raise SandboxError(f"`user: {user}`: there is no group {group!r} on this host") from None
    return uid, gid
