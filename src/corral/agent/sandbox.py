"""The job sandbox: every host-process job (no ``image``) in network, mount and uid isolation of its own.

:class:`Sandboxes` is this agent's view of the job sandbox. It holds the host's *slots*
(:mod:`corral.agent.sandbox_slots`: one per sandboxed job, shared by every agent on the host through records
in a state directory under an ``flock``), the agent's spare network (:mod:`corral.agent.sandbox_spare`) and
its launcher (:mod:`corral.agent.sandbox_launch`), and gives each job its :class:`JobSandbox`
(:mod:`corral.agent.sandbox_types`): the network namespace and veth (:mod:`corral.agent.sandbox_net`), the
port relays (:mod:`corral.agent.portfwd`) and the command line that starts the job through the launcher
(:mod:`corral.agent.sandbox_exec`: mount namespace, read-only host, the job's own paths at the absolute places
the configuration names, its uid).

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

import logging
import os
import sys
import time

from . import sandbox_net, slot_owner
from .latest_call import LatestCall
from .portfwd import Forwarder
from .sandbox_launch import Launcher
from .sandbox_launch import Pipes as Pipes  # named here too, where the agent has always found them
from .sandbox_launch import start as start
from .sandbox_slots import Slots, kill_uid, mount_ns
from .sandbox_spare import SPARE_JOB, SpareNetwork
from .sandbox_types import DEFAULT_STATE_DIR as DEFAULT_STATE_DIR
from .sandbox_types import MODES as MODES
from .sandbox_types import JobSandbox as JobSandbox
from .sandbox_types import SandboxConfig as SandboxConfig
from .sandbox_types import SandboxError as SandboxError
from .sandbox_types import parse_uid_range as parse_uid_range

log = logging.getLogger("corral.agent")

#: How long the bridge outlives the host's last sandbox: jobs that follow each other keep one bridge.
BRIDGE_LINGER_S = 1.0


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


def release_slots_of(work_dir: str, config: SandboxConfig) -> int:
    """Give back the slots held by the agent of ``work_dir`` whose process is gone (killed: it cannot give
    them back itself): their uids' processes killed, their networks removed, the bridge too if they were the
    host's last. Returns how many. Called from outside the agent (``agent/leftovers.py``)."""
    if probe(config) is not None:
        return 0
    slots = Slots(os.path.abspath(work_dir), config)
    released = 0
    with slots.locked() as held:
        for n, rec in slots.records(held).items():
            if slots.mine(rec) and not slot_owner.running(rec):
                slots.release(held, n)
                released += 1
    return released


class Sandboxes:
    """The slots of this host and the sandboxes of this agent's jobs."""

    def __init__(self, work_dir: str, config: SandboxConfig) -> None:
        self.work_dir = os.path.abspath(work_dir)
        self.config = config
        self.reason = probe(config)
        self.userns = _user_namespaces()
        self.slots = Slots(self.work_dir, config)
        self.spare = SpareNetwork(self.slots, enabled=self.reason is None)
        self.launcher = Launcher(config, self.work_dir)
        self._bridge_check_later = LatestCall(self._bridge_check, "bridge-check")

    @property
    def available(self) -> bool:
        return self.reason is None

    # ---- slots (host-wide, under the lock) ------------------------------------------------------
    def reserve(self, job_id: str) -> int:
        """The job's slot: the one already recorded for it, else the lowest free one (one whose last job's veth
        is gone, if there is one)."""
        with self.slots.locked() as slots:
            return self.slots.reserve(slots, job_id)

    def bridge_down_if_idle(self) -> None:
        """The bridge and its NAT rules removed if no slot of the host is taken (a job that started meanwhile
        keeps them). A job's end asks for it :data:`BRIDGE_LINGER_S` after the job is seen finished
        (:meth:`bridge_down_later`): the teardown (two processes, tens of ms) is then off the path from the job's
        exit to its end, and a host whose jobs follow each other keeps one bridge instead of one per job."""
        if not self.available:
            return
        with self.slots.locked() as slots:
            if not self.slots.records(slots):
                self.slots.bridge_down()

    def bridge_down_later(self, delay: float = BRIDGE_LINGER_S) -> None:
        """:meth:`bridge_down_if_idle` in ``delay`` seconds (one pending check per agent: a later call moves it)."""
        if self.available:
            self._bridge_check_later.after(delay)

    def _bridge_check(self) -> None:
        try:
            self.spare.release_if_idle()
            self.bridge_down_if_idle()
        except OSError:
            log.exception("cannot remove the sandbox bridge")

    def cancel_bridge_check(self) -> None:
        """Forget a pending :meth:`bridge_down_later` (the agent's shutdown does the check itself: ``reap``)."""
        self._bridge_check_later.cancel()

    def release(self, job_id: str) -> None:
        """Give back the slot reserved for a job that never ran in it (it is forgotten)."""
        if not self.available:
            return
        with self.slots.locked() as slots:
            for n, rec in self.slots.records(slots).items():
                if self.slots.mine(rec) and rec.get("job_id") == job_id:
                    self.slots.release(slots, n)

    def release_stale(self, known: set[str], max_age: float = 600.0) -> None:
        """Give back this agent's slots reserved over ``max_age`` ago for jobs it never got (a run stopped
        between the reservation of its nodes' addresses and their submission)."""
        if not self.available:
            return
        cutoff = time.time() - max_age
        with self.slots.locked() as slots:
            for n, rec in self.slots.records(slots).items():
                mine = self.slots.mine(rec)
                if mine and rec.get("job_id") not in known and float(rec.get("since") or 0) < cutoff:
                    self.slots.release(slots, n)

    def reap(self, live: set[str]) -> int:
        """After a start: release this agent's slots whose job is not ``live``, slots of agents whose
        work dir is gone, and namespaces no record claims. Returns how many were released."""
        if not self.available:
            return 0
        released = 0
        with self.slots.locked() as slots:
            records = self.slots.records(slots)
            for n, rec in records.items():
                mine = self.slots.mine(rec)
                # an agent whose work dir is gone (seen from the same mount namespace: a host's agents, not
                # those of a container or chroot that shares the state dir)
                gone = rec.get("mnt") == mount_ns() and not os.path.isdir(str(rec.get("work_dir")))
                gone = gone and not slot_owner.running(rec)  # an agent still ending gives its slots back itself
                if (mine and rec.get("job_id") not in live) or gone:
                    self.slots.release(slots, n)
                    released += 1
            for n in sandbox_net.leftover_slots():
                if n not in records:
                    sandbox_net.job_net_down(n)
                    released += 1
            if not self.slots.records(slots):
                self.slots.bridge_down()
        if SPARE_JOB not in live:
            self.spare.forget()  # its slot was this agent's and not live: given back above
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
        spare = None if host_network else self.spare.take(job_id)
        try:
            if spare is not None:
                slot, netns = spare
            else:
                slot, netns = self.slots.open_network(job_id, host_network)
        except (sandbox_net.NetError, OSError) as e:
            raise SandboxError(f"cannot set up the job's network: {e}") from None
        uid = self.slots.uid(slot)
        if not netns:
            return JobSandbox(slot=slot, address=None, uid=uid, netns=None, userns=self.userns, job_id=job_id)
        address = self.slots.address(slot)
        sb = JobSandbox(slot=slot, address=address, uid=uid, netns=netns, userns=self.userns, job_id=job_id)
        try:
            for port in ports:
                sb.forwarders[port] = Forwarder(address, port)
        except OSError as e:
            self.close(sb)
            raise SandboxError(f"cannot listen for the job's port: {e}") from None
        return sb

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
        with self.slots.locked() as slots:
            if not self.slots.holds(sb, self.slots.record(slots, sb.slot)):
                return
        if sb.netns is not None:
            sandbox_net.job_net_down(sb.slot, wait=False)  # the slot's next job deletes a veth still there
        with self.slots.locked() as slots:
            if self.slots.holds(sb, self.slots.record(slots, sb.slot)):
                self.slots.forget(slots, sb.slot, bridge=not keep_bridge)


def _user_namespaces() -> bool:
    """Whether this kernel lets the agent give jobs user namespaces (else a job runs as its uid only)."""
    try:
        with open("/proc/sys/user/max_user_namespaces") as f:
            return int(f.read().strip() or 0) > 0
    except (OSError, ValueError):
        return os.path.exists("/proc/self/ns/user")


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
