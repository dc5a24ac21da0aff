"""The host's sandbox slots, as one agent sees them: :class:`Slots`.

A slot ``n`` gives its job the address ``n + 2`` of the sandbox subnet and the uid ``n`` of
``CORRAL_JOB_UID_RANGE``. Every agent on the host shares the slots through records in a state directory
(``/run/corral-sandbox/slots/<n>.json``: gone at reboot, like what they describe), read and written under an
``flock`` (:meth:`Slots.locked`); a record names the agent's work dir, the job, the agent's mount namespace
and process (:mod:`corral.agent.slot_owner`). The bridge and its NAT rules are up while any slot is taken (a
marker in the state directory says for which network namespace they were put up). A slot's network -- its
namespace and veth (:mod:`corral.agent.sandbox_net`) -- is made outside the lock: the record, which exists
first and goes last, keeps every other agent off it.

The methods whose first argument is ``slots`` (the records' directory) are called with the lock held.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import itertools
import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

from . import sandbox_net, slot_owner
from .job import write_page, write_whole
from .sandbox_types import JobSandbox, SandboxConfig, SandboxError


class Slots:
    """This host's slots, their records, the bridge, and a slot's network (see the module's docstring)."""

    def __init__(self, work_dir: str, config: SandboxConfig) -> None:
        self.work_dir = os.path.abspath(work_dir)
        self.config = config
        self.network = ipaddress.IPv4Network(config.subnet)
        lo, hi = config.uid_range
        self.size = min(hi - lo + 1, self.network.num_addresses - 3)

    def address(self, slot: int) -> str:
        return str(self.network.network_address + 2 + slot)

    def uid(self, slot: int) -> int:
        return self.config.uid_range[0] + slot

    # ---- the records, under the host's lock ------------------------------------------------------
    @contextlib.contextmanager
    def locked(self) -> Iterator[str]:
        """The host's lock held; yields the records' directory."""
        slots = os.path.join(self.config.state_dir, "slots")
        os.makedirs(slots, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(self.config.state_dir, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield slots
        finally:
            os.close(fd)

    @staticmethod
    def records(slots: str) -> dict[int, dict[str, Any]]:
        """Every slot taken, with its record (``{}`` where it cannot be read)."""
        out = {}
        for name in os.listdir(slots):
            if name.endswith(".json") and name[:-5].isdigit():
                try:
                    with open(os.path.join(slots, name)) as f:
                        out[int(name[:-5])] = json.load(f)
                except (OSError, ValueError):
                    out[int(name[:-5])] = {}
        return out

    @staticmethod
    def record(slots: str, slot: int) -> dict[str, Any] | None:
        """The record of ``slot`` alone (None: not taken, or unreadable)."""
        try:
            with open(os.path.join(slots, f"{slot}.json")) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            return None
        return rec if isinstance(rec, dict) else None

    @staticmethod
    def rewrite(slots: str, slot: int, rec: dict[str, Any]) -> None:
        """Replace ``slot``'s record: in place, one page written whole (:func:`corral.agent.job.write_page`;
        every reader holds the host's lock), not a new file renamed over it -- twice per job (the spare kept and
        taken), and a new file costs more than the write on a busy disk. A record larger than a page (never
        seen: a work dir of thousands of characters) is written to a new file renamed over it."""
        path = os.path.join(slots, f"{slot}.json")
        data = json.dumps(rec).encode()
        if not write_page(path, data, check_size=True):
            write_whole(path, data)

    def mine(self, rec: dict[str, Any]) -> bool:
        """Whether a record is of this agent's work dir."""
        return rec.get("work_dir") == self.work_dir

    def holds(self, sb: JobSandbox, rec: dict[str, Any] | None) -> bool:
        """Whether ``sb``'s slot is still its job's, on this agent (``rec``: the slot's record, read under the
        host's lock)."""
        if rec is None or not self.mine(rec):
            return False
        return not sb.job_id or rec.get("job_id") == sb.job_id

    def reserve(self, slots: str, job_id: str) -> int:
        """The job's slot: the one already recorded for it, else the lowest free one (one whose last job's veth
        is gone, if there is one)."""
        records = self.records(slots)
        for n, rec in records.items():
            if self.mine(rec) and rec.get("job_id") == job_id:
                return n
        # a free slot whose last job's veth the kernel has removed already (else its next job waits for that)
        free = (n for n in range(self.size) if n not in records)
        settled = (n for n in range(self.size) if n not in records and not sandbox_net.veth_exists(n))
        for n in itertools.chain(itertools.islice(settled, 1), itertools.islice(free, 1)):
            with open(os.path.join(slots, f"{n}.json"), "x") as f:
                rec = {"work_dir": self.work_dir, "job_id": job_id, "mnt": mount_ns(), "since": time.time()}
                f.write(json.dumps({**rec, **slot_owner.owner()}))
            return n
        raise SandboxError(f"all {self.size} sandbox slots of this host are taken (CORRAL_JOB_UID_RANGE)")

    def release(self, slots: str, slot: int, bridge: bool = True) -> None:
        """Give back ``slot``: its uid's processes killed, its namespace and veth gone; the bridge and its rules
        too if it was the host's last slot (unless ``bridge`` is False: ``Sandboxes.bridge_down_if_idle``
        later)."""
        kill_uid(self.uid(slot))  # what the job left running outside its process group
        sandbox_net.job_net_down(slot)
        self.forget(slots, slot, bridge)

    def forget(self, slots: str, slot: int, bridge: bool) -> None:
        """Remove ``slot``'s record (its network gone already); the bridge too if it was the host's last slot
        and ``bridge``."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(slots, f"{slot}.json"))
        if bridge and not self.records(slots):
            self.bridge_down()

    # ---- the bridge, under the host's lock -------------------------------------------------------
    def bridge_up(self) -> None:
        """The bridge and its rules, unless this host's agents already put them up: a marker in the state
        directory, written once they are up and removed before they go, says so -- for the network namespace it
        names (an agent in a container of its own network may share the state directory)."""
        marker = os.path.join(self.config.state_dir, "bridge")
        mine = f"{self.config.bridge} {self.network} {net_ns()}\n"
        try:
            with open(marker) as f:
                if f.read() == mine and sandbox_net.bridge_exists(self.config.bridge):
                    return
        except OSError:
            pass
        sandbox_net.bridge_up(self.config.bridge, self.network)
        with open(marker, "w") as f:
            f.write(mine)

    def bridge_down(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.config.state_dir, "bridge"))
        sandbox_net.bridge_down(self.config.bridge, self.network)

    # ---- a slot's network ------------------------------------------------------------------------
    def open_network(self, job_id: str, host_network: bool) -> tuple[int, str]:
        """The job's slot and its namespace (none with ``host_network``: an empty path). The lock is held only
        to reserve the slot and bring the bridge up."""
        with self.locked() as slots:
            slot = self.reserve(slots, job_id)
            if host_network:
                return slot, ""
            try:
                self.bridge_up()
            except sandbox_net.NetError:
                self.forget(slots, slot, bridge=True)
                raise
        try:
            return slot, sandbox_net.job_net_up(slot, self.address(slot), self.config.bridge, self.network)
        except sandbox_net.NetError:
            sandbox_net.job_net_down(slot)
            with self.locked() as slots:
                self.forget(slots, slot, bridge=True)
            raise


def net_ns() -> str:
    """This process's network namespace (as ``/proc/self/ns/net`` names it; empty if it cannot be read)."""
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return ""


def mount_ns() -> str:
    """This process's mount namespace (as ``/proc/self/ns/mnt`` names it; empty if it cannot be read)."""
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
