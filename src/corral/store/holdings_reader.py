"""What the projects hold, as the scheduling worker reads it pass after pass: only the instances that changed are
read again.

Quotas and fair sharing need each project's holding on every pass, and read whole it is a join of every holding job
with its instance: with thousands of busy hosts, the largest read of a pass. A job starts holding when a commit
places it on an instance (``plan_apply`` writes the instance's blocks) and stops when its end releases them
(``workers/jobs/outcomes.py``): both write the instance's row, which moves its ``version`` (``store/fleet_reader.py``).
So a pass reads the holding jobs of the instances whose version moved since it last read them, out of the live
instances' state the fleets' read has just taken, and keeps what it read of the others; an instance no longer live
holds nothing here. Each project's total is kept by taking away what an instance held before and adding what it
holds now.

A job whose status left the holding ones with no write of its instance's row would be counted on until the next
whole read (``whole=True``: every live instance read again and every total summed afresh), which the worker makes
on its safety-net interval. What a pass reads may be stale by its commit, as any read of the pass: the commit point
counts a project's holding from the rows under the project's lock (``plan_apply``), so no quota is overrun by it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.quotas import Usage
from corral.store.fleet_reader import State
from corral.store.quotas import HeldOn, Holding, held_on_instances
from corral.store.tables import instances

#: How many instance ids one read binds at most.
_CHUNK = 500


@dataclass
class HoldingsReader:
    """Each project's holding, as last read."""

    #: instance id -> its version when its holding jobs were last read.
    _versions: dict[str, int] = field(default_factory=dict)
    #: instance id -> project id -> what the project's jobs hold there.
    _held: dict[str, dict[str, Usage]] = field(default_factory=dict)
    #: project id -> what it holds in all, and the instances it holds jobs on.
    _totals: dict[str, Usage] = field(default_factory=dict)
    _on: dict[str, set[str]] = field(default_factory=dict)
    #: project id -> the record last handed out, kept while the project's holding did not move.
    _records: dict[str, Holding] = field(default_factory=dict)

    async def read(self, conn: AsyncConnection, live: Iterable[State], whole: bool = False) -> dict[str, Holding]:
        """project id -> what its holding jobs hold (as ``quotas.project_holdings`` counts it, on the live
        instances), given the live instances' state (``FleetReader.live``) read in this transaction."""
        versions = {instance_id: version for instance_id, _, version in live}
        if whole:
            self._versions, self._held, self._totals, self._on, self._records = {}, {}, {}, {}, {}
        moved = [i for i, v in versions.items() if self._versions.get(i) != v]
        gone = [i for i in self._versions if i not in versions]
        for instance_id in gone:
            self._forget(instance_id)
            del self._versions[instance_id]
        fresh: dict[str, dict[str, Usage]] = {i: {} for i in moved}
        for start in range(0, len(moved), _CHUNK):
            for instance_id, project_id, usage in await self._held_on(conn, moved[start : start + _CHUNK]):
                fresh[instance_id][project_id] = usage
        for instance_id, held in fresh.items():
            self._forget(instance_id)
            self._add(instance_id, held)
            self._versions[instance_id] = versions[instance_id]
        return self._holdings()

    @staticmethod
    async def _held_on(conn: AsyncConnection, ids: list[str]) -> list[HeldOn]:
        return await held_on_instances(conn, instances.c.id.in_(ids))

    def _forget(self, instance_id: str) -> None:
        for project_id, usage in self._held.pop(instance_id, {}).items():
            total = self._totals[project_id]
            for dim, amount in usage.items():
                total[dim] -= amount
            on = self._on[project_id]
            on.discard(instance_id)
            self._records.pop(project_id, None)
            if not on:  # holds nothing: no remainder of the additions and subtractions is kept
                del self._totals[project_id], self._on[project_id]

    def _add(self, instance_id: str, held: dict[str, Usage]) -> None:
        if not held:
            return
        self._held[instance_id] = held
        for project_id, usage in held.items():
            total = self._totals.setdefault(project_id, {})
            for dim, amount in usage.items():
                total[dim] = total.get(dim, 0.0) + amount
            self._on.setdefault(project_id, set()).add(instance_id)
            self._records.pop(project_id, None)

    def _holdings(self) -> dict[str, Holding]:
        out: dict[str, Holding] = {}
        for project_id, total in self._totals.items():
            record = self._records.get(project_id)
            if record is None:
                on = self._on[project_id]
                usage = {dim: amount for dim, amount in total.items() if amount > 1e-9}
                usage["instances"] = float(len(on))
                record = self._records[project_id] = Holding(usage, frozenset(on))
            out[project_id] = record
        return out
