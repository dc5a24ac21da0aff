"""When a host whose agent stopped answering is flagged, and when it is given up (pure).

The host-upkeep worker checks every provisioned instance's agent on an interval. :func:`after_check` keeps
what the checks said (failures in a row, and since when); :func:`verdict` says what follows:

- two failed checks in a row flag the instance ``unreachable``: it takes no new work;
- once its agent has not answered for its backend's bound (``Settings.unreachable_timeout``) an instance
  its backend made (a local agent, a cloud VM) is given up: its jobs fail ``instance_unreachable`` and it is
  terminated, which frees its place in the fleet for a replacement. A host the backend was given (SSH) is
  never given up here: it stays flagged, out of the capacity, until its agent answers again, and its jobs
  fail by the same bound through the jobs worker.

``now`` is a parameter; nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

#: Failed checks in a row that flag an instance unreachable.
FAILURES_TO_FLAG = 2


@dataclass(frozen=True)
class HostHealth:
    """What the checks of one instance said: failures in a row, and when the first of them began."""

    failures: int = 0
    down_since: float | None = None


class Verdict(str, Enum):
    HEALTHY = "healthy"
    #: Not answering, not yet flagged (one failed check may be a blip).
    DOUBTFUL = "doubtful"
    #: Flag the instance unreachable: it takes no new work.
    FLAG = "flag"
    #: Flagged already: wait for its agent or for the bound.
    WAIT = "wait"
    #: Past the bound on a backend that can replace it: fail its jobs and terminate it.
    GIVE_UP = "give_up"


def after_check(health: HostHealth, answered: bool, started_at: float) -> HostHealth:
    """The health after one check that began at ``started_at``."""
    if answered:
        return HostHealth()
    since = health.down_since if health.down_since is not None else started_at
    return HostHealth(failures=health.failures + 1, down_since=since)


def verdict(health: HostHealth, flagged: bool, now: float, bound: float, replaceable: bool) -> Verdict:
    """What follows a check (``flagged``: the instance is flagged unreachable already)."""
    if health.failures == 0 or health.down_since is None:
        return Verdict.HEALTHY
    if replaceable and now - health.down_since >= bound:
        return Verdict.GIVE_UP
    if flagged:
        return Verdict.WAIT
    return Verdict.FLAG if health.failures >= FAILURES_TO_FLAG else Verdict.DOUBTFUL
