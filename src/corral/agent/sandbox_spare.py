"""A spare sandbox network per agent: a slot with its namespace and veth ready ahead, off any job's path.

Making a job's network costs the host more than anything else the agent does for a short job, most of it in
the kernel's workers when a namespace goes (the NAT's walk of the connection-tracking table at its veth's
removal, the namespace's own cleanup). So a sandboxed job that ended is given back in one of two ways:

- its namespace is kept as the agent's spare (:meth:`SpareNetwork.keep`) when the job left nothing
  in it: its processes are killed before (``Sandboxes.quiesce``), a job cannot change the namespace itself
  (its owner is the host's user namespace, where the job has no capability), and the namespace holds no
  socket, not even one closing or in ``TIME_WAIT`` (:func:`corral.agent.sandbox_net.netns_quiet`). The slot
  keeps its address, uid and veth, so its next job finds it as a fresh one would be;
- else the namespace goes, and the agent makes a fresh spare for its next job (:meth:`SpareNetwork.prepare`).

:meth:`SpareNetwork.take` hands the spare to the agent's next job under the host's lock. A spare is a
slot like any other (recorded, so that no other agent touches it, with :data:`SPARE_JOB` as its job). The
bridge's linger check (:meth:`Sandboxes.bridge_down_later`) gives it back once this agent holds no other
slot, so that an idle host keeps nothing; an agent's start (``reap``) gives back any spare a crashed agent
left.

:class:`corral.agent.sandbox.Sandboxes` holds a :class:`SpareNetwork`, which keeps its spare among the agent's
slots (:class:`corral.agent.sandbox_slots.Slots`).
"""

from __future__ import annotations

import logging
import threading
import time

from . import sandbox_net
from .sandbox_slots import Slots
from .sandbox_types import JobSandbox

log = logging.getLogger("corral.agent")

#: The job id a spare slot is recorded under (no job has it: ids are the server's UUIDs).
SPARE_JOB = "(spare)"


class SpareNetwork:
    """This agent's spare slot and network (see the module's docstring); none while ``enabled`` is False (the
    host gives jobs no sandbox)."""

    def __init__(self, slots: Slots, enabled: bool) -> None:
        self.slots = slots
        self.enabled = enabled
        self._lock = threading.Lock()
        self._spare: tuple[int, str] | None = None
        self._stopped = False

    @property
    def held(self) -> tuple[int, str] | None:
        """The spare's slot and namespace, if the agent has one now."""
        return self._spare

    def prepare(self) -> None:
        """Make this agent's spare slot and network, unless it has one (or is making it)."""
        if not self.enabled or not self._lock.acquire(blocking=False):
            return
        try:
            if self._spare is not None or self._stopped:
                return
            self._spare = self.slots.open_network(SPARE_JOB, host_network=False)
        except (sandbox_net.NetError, OSError) as e:
            log.warning("cannot make a spare sandbox network: %s", e)
        finally:
            self._lock.release()

    def keep(self, sb: JobSandbox) -> bool:
        """Keep an ended job's network as this agent's spare (its slot recorded under :data:`SPARE_JOB`), if the
        agent has none and the job left its namespace quiet; whether it was kept (else the caller closes it).
        The job's processes must be gone already (``Sandboxes.quiesce``)."""
        if sb.netns is None or not self.enabled or not self._lock.acquire(blocking=False):
            return False
        try:
            if self._spare is not None or self._stopped or not sandbox_net.netns_quiet(sb.netns):
                return False
            with self.slots.locked() as slots:
                rec = self.slots.record(slots, sb.slot)
                if rec is None or not self.slots.holds(sb, rec):
                    return False  # given back meanwhile (a reap)
                self.slots.rewrite(slots, sb.slot, {**rec, "job_id": SPARE_JOB, "since": time.time()})
            self._spare = (sb.slot, sb.netns)
            return True
        finally:
            self._lock.release()

    def take(self, job_id: str) -> tuple[int, str] | None:
        """The spare slot and namespace, now ``job_id``'s (its record rewritten under the host's lock); None if
        there is none ready (one being made is not waited for)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            spare, self._spare = self._spare, None
            if spare is None:
                return None
            with self.slots.locked() as slots:
                records = self.slots.records(slots)
                if any(self.slots.mine(r) and r.get("job_id") == job_id for r in records.values()):
                    self._spare = spare  # the job has its slot already (its address given out ahead)
                    return None
                rec = records.get(spare[0])
                if rec is None or not self.slots.mine(rec) or rec.get("job_id") != SPARE_JOB:
                    return None  # given back meanwhile (a reap)
                self.slots.rewrite(slots, spare[0], {**rec, "job_id": job_id})
            return spare
        finally:
            self._lock.release()

    def release_if_idle(self) -> None:
        """Give the spare back if this agent holds no other slot (no job of it runs in a sandbox)."""
        with self._lock:
            if self._spare is None:
                return
            slot = self._spare[0]
            with self.slots.locked() as slots:
                mine = [n for n, rec in self.slots.records(slots).items() if self.slots.mine(rec)]
                if mine != [slot]:
                    return
                self._spare = None
            sandbox_net.job_net_down(slot, wait=False)
            with self.slots.locked() as slots:
                self.slots.forget(slots, slot, bridge=False)

    def stop(self) -> None:
        """No spare is made from now on (the agent stops): one being made is waited for, so that the reap
        that follows gives it back."""
        with self._lock:
            self._stopped = True

    def forget(self) -> None:
        """The spare's slot was given back by a reap (the agent's start or stop)."""
        with self._lock:
            self._spare = None
