"""A spare sandbox network per agent: a slot with its namespace and veth ready ahead, off any job's path.

Making a job's network costs the host more than anything else the agent does for a short job, most of it in
the kernel's workers when a namespace goes (the NAT's walk of the connection-tracking table at its veth's
removal, the namespace's own cleanup). So a sandboxed job that ended is given back in one of two ways:

- its namespace is kept as the agent's spare (:meth:`SpareNetwork.keep_as_spare`) when the job left nothing
  in it: its processes are killed before (``Sandboxes.quiesce``), a job cannot change the namespace itself
  (its owner is the host's user namespace, where the job has no capability), and the namespace holds no
  socket, not even one closing or in ``TIME_WAIT`` (:func:`corral.agent.sandbox_net.netns_quiet`). The slot
  keeps its address, uid and veth, so its next job finds it as a fresh one would be;
- else the namespace goes, and the agent makes a fresh spare for its next job (:meth:`prepare_spare`).

:meth:`SpareNetwork.take_spare` hands the spare to the agent's next job under the host's lock. A spare is a
slot like any other (recorded, so that no other agent touches it, with :data:`SPARE_JOB` as its job). The
bridge's linger check (:meth:`Sandboxes.bridge_down_later`) gives it back once this agent holds no other
slot, so that an idle host keeps nothing; an agent's start (``reap``) gives back any spare a crashed agent
left.

:class:`SpareNetwork` is a base of :class:`corral.agent.sandbox.Sandboxes`, which provides the slots.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from . import sandbox_net

if TYPE_CHECKING:
    from .sandbox import JobSandbox

log = logging.getLogger("corral.agent")

#: The job id a spare slot is recorded under (no job has it: ids are the server's UUIDs).
SPARE_JOB = "(spare)"


class SpareNetwork:
    work_dir: str
    reason: str | None
    _spare_lock: threading.Lock
    _spare: tuple[int, str] | None
    _no_spares: bool

    # what Sandboxes provides (its own methods come first in its MRO)
    def _locked(self) -> contextlib.AbstractContextManager[str]:
        raise NotImplementedError

    def _open_network(self, job_id: str, host_network: bool) -> tuple[int, str]:
        raise NotImplementedError

    def _forget_slot(self, slots: str, slot: int, bridge: bool) -> None:
        raise NotImplementedError

    def _records(self, slots: str) -> dict[int, dict[str, Any]]:
        raise NotImplementedError

    def prepare_spare(self) -> None:
        """Make this agent's spare slot and network, unless it has one (or is making it)."""
        if self.reason is not None or not self._spare_lock.acquire(blocking=False):
            return
        try:
            if self._spare is not None or self._no_spares:
                return
            self._spare = self._open_network(SPARE_JOB, host_network=False)
        except (sandbox_net.NetError, OSError) as e:
            log.warning("cannot make a spare sandbox network: %s", e)
        finally:
            self._spare_lock.release()

    def keep_as_spare(self, sb: JobSandbox) -> bool:
        """Keep an ended job's network as this agent's spare (its slot recorded under :data:`SPARE_JOB`), if the
        agent has none and the job left its namespace quiet; whether it was kept (else the caller closes it).
        The job's processes must be gone already (``Sandboxes.quiesce``)."""
        if sb.netns is None or self.reason is not None or not self._spare_lock.acquire(blocking=False):
            return False
        try:
            if self._spare is not None or self._no_spares or not sandbox_net.netns_quiet(sb.netns):
                return False
            with self._locked() as slots:
                rec = self._record(slots, sb.slot)
                if rec is None or not self._holds(sb, rec):
                    return False  # given back meanwhile (a reap)
                self._rewrite(slots, sb.slot, {**rec, "job_id": SPARE_JOB, "since": time.time()})
            self._spare = (sb.slot, sb.netns)
            return True
        finally:
            self._spare_lock.release()

    def take_spare(self, job_id: str) -> tuple[int, str] | None:
        """The spare slot and namespace, now ``job_id``'s (its record rewritten under the host's lock); None if
        there is none ready (one being made is not waited for)."""
        if not self._spare_lock.acquire(blocking=False):
            return None
        try:
            spare, self._spare = self._spare, None
            if spare is None:
                return None
            with self._locked() as slots:
                records = self._records(slots)
                if any(r.get("work_dir") == self.work_dir and r.get("job_id") == job_id for r in records.values()):
                    self._spare = spare  # the job has its slot already (its address given out ahead)
                    return None
                rec = records.get(spare[0])
                if rec is None or rec.get("work_dir") != self.work_dir or rec.get("job_id") != SPARE_JOB:
                    return None  # given back meanwhile (a reap)
                self._rewrite(slots, spare[0], {**rec, "job_id": job_id})
            return spare
        finally:
            self._spare_lock.release()

    def release_spare_if_idle(self) -> None:
        """Give the spare back if this agent holds no other slot (no job of it runs in a sandbox)."""
        with self._spare_lock:
            if self._spare is None:
                return
            slot = self._spare[0]
            with self._locked() as slots:
                mine = [n for n, rec in self._records(slots).items() if rec.get("work_dir") == self.work_dir]
                if mine != [slot]:
                    return
                self._spare = None
            sandbox_net.job_net_down(slot, wait=False)
            with self._locked() as slots:
                self._forget_slot(slots, slot, bridge=False)

    def stop_spares(self) -> None:
        """No spare is made from now on (the agent stops): one being made is waited for, so that the reap
        that follows gives it back."""
        with self._spare_lock:
            self._no_spares = True

    def forget_spare(self) -> None:
        """The spare's slot was given back by a reap (the agent's start or stop)."""
        with self._spare_lock:
            self._spare = None

    def _holds(self, sb: JobSandbox, rec: dict[str, Any] | None) -> bool:
        """Whether ``sb``'s slot is still its job's, on this agent (``rec``: the slot's record, read under the
        host's lock)."""
        if rec is None or rec.get("work_dir") != self.work_dir:
            return False
        return not sb.job_id or rec.get("job_id") == sb.job_id

    @staticmethod
    def _record(slots: str, slot: int) -> dict[str, Any] | None:
        """The record of ``slot`` alone (None: not taken, or unreadable)."""
        try:
            with open(os.path.join(slots, f"{slot}.json")) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            return None
        return rec if isinstance(rec, dict) else None

    @staticmethod
    def _rewrite(slots: str, slot: int, rec: dict[str, Any]) -> None:
        tmp = os.path.join(slots, f".{slot}.json.tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps(rec))
        os.replace(tmp, os.path.join(slots, f"{slot}.json"))
