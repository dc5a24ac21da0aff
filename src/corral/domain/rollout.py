"""One replica group of a service, reconciled (pure): which replicas to start, bring up to date in place,
drain and stop, given its replicas, the run's deployment, the desired count and ``now``.

The rules (dstack's rolling deployment, ``ROLLING_DEPLOYMENT_MAX_SURGE = 1``, without its ways of taking
the serving version down):

* A replica whose job spec equals the current deployment's is brought up to date in place (its
  ``deployment_num`` bumped): a change of ``replicas`` or ``scaling`` only, or re-applying the previous
  configuration, restarts nothing.
* While out-of-date replicas remain, at most ``desired + 1`` replicas are active: a new one is started
  when there is room; an out-of-date replica that is not in rotation is stopped at once; an out-of-date
  replica in rotation is drained only when as many ready replicas as ``desired`` remain without it. A new
  replica that never becomes ready (exits, fails its probes) therefore never takes the old version out of
  rotation.
* On a full fleet (the new replica waits for capacity: the surge has no room) old replicas are replaced one
  at a time: one old replica in rotation is drained -- its place frees for the new one -- while at least
  ``desired - 1`` stay in rotation, and only when ``desired`` is more than 1 (a single replica is never
  taken down for its successor: the rollout says so and waits for room). The next old one goes once the new
  one is ready and the next new one waits for room in turn.
* With every replica up to date, the group is scaled to ``desired``: the least important go first
  (not in rotation before in rotation, then the highest ``replica_num``); one in rotation is drained.
* A drained replica is stopped once no server replica has a request in flight to it (``held`` false),
  but not before ``DRAIN_SETTLE`` after it left rotation (a server routing from a route read just before
  may still be recording its hold), and ``drain_timeout`` after it left rotation at the latest.

Imports nothing of corral.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

#: The shortest time a drained replica stays up (see the rules above).
DRAIN_SETTLE = 1.0


class Phase(str, Enum):
    #: submitted, provisioning, pulling, running but not ready -- or failed and to be submitted again
    STARTING = "starting"
    #: running, ready and routed to
    READY = "ready"
    #: left rotation at ``drain_at``; stopped once drained
    DRAINING = "draining"


@dataclass(frozen=True)
class ReplicaView:
    job_id: str
    replica_num: int
    deployment_num: int
    phase: Phase
    #: Its job spec equals the current deployment's (it can be brought up to date in place).
    same_spec: bool = False
    drain_at: float | None = None
    #: Some server replica may have requests in flight to it (``store.service_drains``).
    held: bool = True
    #: A new replica that is waiting to be placed for lack of capacity (the surge has no room).
    waiting_for_capacity: bool = False


@dataclass(frozen=True)
class GroupDecision:
    #: How many new replicas of the current deployment to start.
    start: int = 0
    #: Replicas brought up to date in place (``deployment_num`` := the run's).
    bump: tuple[str, ...] = ()
    #: Replicas taken out of rotation now (``drain_at`` := now).
    drain: tuple[str, ...] = ()
    #: Replicas stopped now (``scaled_down``): not in rotation, or drained.
    stop: tuple[str, ...] = ()
    #: Out-of-date replicas remain (a rollout is in progress).
    rolling: bool = False
    #: When to look again (a drain ends).
    wake_at: float | None = None
    notes: tuple[str, ...] = field(default=())


def _order(r: ReplicaView) -> tuple[int, int]:
    """Least important first: not in rotation before in rotation, then the highest number."""
    return (1 if r.phase == Phase.READY else 0, -r.replica_num)


def decide_group(  # noqa: C901
    replicas: Sequence[ReplicaView],
    deployment_num: int,
    desired: int,
    now: float,
    drain_timeout: float,
) -> GroupDecision:
    """The group's next step. ``replicas`` are its active replicas (latest submissions not finished, or
    failed and to be submitted again)."""
    desired = max(0, desired)
    stop: list[str] = []
    wake: list[float] = []
    for r in replicas:
        if r.phase == Phase.DRAINING:
            since = r.drain_at if r.drain_at is not None else now
            end = since + drain_timeout if r.held else since + min(drain_timeout, DRAIN_SETTLE)
            if end <= now:
                stop.append(r.job_id)
            else:
                wake.append(end)
    live = [r for r in replicas if r.phase != Phase.DRAINING]
    bump = tuple(r.job_id for r in live if r.deployment_num < deployment_num and r.same_spec)
    bumped = set(bump)
    new = [r for r in live if r.deployment_num >= deployment_num or r.job_id in bumped]
    old = [r for r in live if r.job_id not in {n.job_id for n in new}]
    drain: list[str] = []
    start_count = 0
    if old:
        # out-of-date replicas not in rotation serve nobody: they go at once
        for r in old:
            if r.phase != Phase.READY:
                stop.append(r.job_id)
        old_ready = sorted((r for r in old if r.phase == Phase.READY), key=_order)
        new_ready = sum(1 for r in new if r.phase == Phase.READY)
        # drain old replicas only while as many ready ones as desired stay in rotation
        removable = max(0, new_ready + len(old_ready) - desired)
        for r in old_ready[:removable]:
            drain.append(r.job_id)
        remaining_old = len(old_ready) - min(removable, len(old_ready))
        if not drain and _no_room_for_the_new(replicas, new, old_ready, desired):
            drain.append(old_ready[0].job_id)  # one at a time: its place goes to the new replica
            remaining_old -= 1
        # max surge 1: at most desired + 1 active replicas while rolling
        room = desired + 1 - (len(new) + remaining_old)
        start_count = max(0, min(desired - len(new), room))
        if len(new) > desired:  # desired went down during the rollout: the new ones not serving yet go
            extra = sorted(new, key=_order)[: len(new) - desired]
            stop.extend(r.job_id for r in extra if r.phase != Phase.READY)
    else:
        if len(new) < desired:
            start_count = desired - len(new)
        elif len(new) > desired:
            for r in sorted(new, key=_order)[: len(new) - desired]:
                (drain if r.phase == Phase.READY else stop).append(r.job_id)
    for _ in drain:
        wake.append(now + min(drain_timeout, DRAIN_SETTLE))
    return GroupDecision(
        start=start_count,
        bump=bump,
        drain=tuple(drain),
        stop=tuple(stop),
        rolling=bool(old),
        wake_at=min(wake) if wake else None,
    )


def _no_room_for_the_new(
    replicas: Sequence[ReplicaView], new: Sequence[ReplicaView], old_ready: Sequence[ReplicaView], desired: int
) -> bool:
    """A new replica waits for capacity while old ones serve, none is draining yet, and one of them can leave
    rotation with ``desired - 1`` still serving (so never the last one, nor with a single replica wanted)."""
    if desired < 2 or not old_ready or any(r.phase == Phase.DRAINING for r in replicas):
        return False
    if not any(r.waiting_for_capacity for r in new):
        return False
    serving = len(old_ready) + sum(1 for r in new if r.phase == Phase.READY)
    return serving - 1 >= desired - 1


def allocate_numbers(count: int, inactive: Sequence[int], taken: Sequence[int]) -> list[int]:
    """Replica numbers for ``count`` new replicas: inactive ones first (lowest first, as dstack reuses them),
    then numbers after the highest ever used. ``replica_num`` is global across a run's groups."""
    busy = set(taken)
    out = [n for n in sorted(set(inactive)) if n not in busy][:count]
    nxt = max([*busy, *inactive, -1]) + 1
    while len(out) < count:
        out.append(nxt)
        nxt += 1
    return out
