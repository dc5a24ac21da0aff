"""Holds: the capacity a preemption freed is promised to the run that preempted.

Once a victim's jobs have ended, the blocks they held on their instance are *held* for the preemptor
(:class:`~corral.scheduler.types.Hold`): no other gang may take them while the preemptor still waits and
the hold lasts, so fair-share order cannot hand them to another project's run (which would make the
preemptor preempt again on a later pass). A hold ends when its run is placed, when it no longer waits
(it is not in the queue), or at its ``until`` bound (:data:`HOLD_FOR` after the victim ended).

Holds are not stored apart: they are read back from the stop record preemption writes (the victim job's
``termination_reason_message`` names the preemptor, :meth:`Preemption.message`), so every server replica
sees the same holds. Pure: ``now`` is a parameter.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass

from corral.scheduler.types import Hold, QueuedJob, Snapshot

#: How long (seconds) after its victim ended the freed capacity waits for the preemptor.
HOLD_FOR = 300.0
_MESSAGE = re.compile(r"^Preempted by run (?P<run>\S+)(?: of project (?P<project>\S+))? \(")


@dataclass(frozen=True)
class Ended:
    """A preempted job that has ended: the ``blocks`` it held on ``instance_id``, its stop ``message``."""

    instance_id: str
    blocks: int
    project_id: str
    message: str
    ended_at: float


def preemptor(message: str | None) -> tuple[str, str | None] | None:
    """The preemptor's run name and project name (None: the victim's project) a stop message names."""
    m = _MESSAGE.match(message or "")
    return (m.group("run"), m.group("project")) if m else None


def holds_for(ended: Iterable[Ended], queue: Sequence[QueuedJob], now: float) -> tuple[Hold, ...]:
    """The holds of the ended victims whose preemptor still waits in ``queue``."""
    by_project: dict[tuple[str, str], str] = {}
    by_name: dict[tuple[str, str], str] = {}
    for q in queue:
        by_project[(q.project_id, q.run_name)] = q.run_id
        if q.project_name:
            by_name[(q.project_name, q.run_name)] = q.run_id
    out: list[Hold] = []
    for e in ended:
        until = e.ended_at + HOLD_FOR
        who = preemptor(e.message)
        if who is None or until <= now:
            continue
        run, project = who
        run_id = by_project.get((e.project_id, run)) if project is None else by_name.get((project, run))
        if run_id is not None:
            out.append(Hold(e.instance_id, run_id, e.blocks, until))
    return tuple(out)


def active(snapshot: Snapshot, now: float) -> dict[str, list[Hold]]:
    """The holds that bind this pass, by run: their run waits in the queue and their bound has not passed."""
    if not snapshot.holds:
        return {}
    waiting = {q.run_id for q in snapshot.queue}
    out: dict[str, list[Hold]] = {}
    for h in snapshot.holds:
        if h.run_id in waiting and h.until > now and h.blocks > 0:
            out.setdefault(h.run_id, []).append(h)
    return out


def by_instance(holds: Iterable[Hold]) -> dict[str, int]:
    """The blocks ``holds`` keep per instance: a run may hold blocks of one instance from several victims
    (a preemptor of two GPUs whose victims had one each on the same host), and they add up."""
    out: dict[str, int] = {}
    for h in holds:
        out[h.instance_id] = out.get(h.instance_id, 0) + h.blocks
    return out


class Reserved:
    """The held blocks taken out of a pass's free blocks, given back to their run while it is placed."""

    def __init__(self, free: MutableMapping[str, int], holds: Mapping[str, list[Hold]]) -> None:
        self.free = free
        #: run id -> instance id -> blocks taken out for it
        self.taken: dict[str, dict[str, int]] = {}
        for run_id, hs in holds.items():
            self.take(run_id, by_instance(hs))

    def take(self, run_id: str, blocks: Mapping[str, int]) -> list[str]:
        """Take ``blocks`` (what is free of them) out for ``run_id``; the instances changed."""
        mine = self.taken.setdefault(run_id, {})
        for inst, n in blocks.items():
            got = min(n, self.free.get(inst, 0))
            if got > 0:
                self.free[inst] -= got
                mine[inst] = mine.get(inst, 0) + got
        return list(blocks)

    def give_back(self, run_id: str) -> list[str]:
        """Give ``run_id``'s held blocks back to the free blocks (for its own placement); the instances."""
        mine = self.taken.pop(run_id, {})
        for inst, n in mine.items():
            self.free[inst] = self.free.get(inst, 0) + n
        return list(mine)
