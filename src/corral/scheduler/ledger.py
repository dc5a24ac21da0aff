"""The ledger of one scheduling pass: capacity as the pass has used it so far (free blocks per instance,
instances per fleet, instances per backend cap, blocks per shared host).

A gang is tried against each fleet on a *trial*: an overlay that records only what the trial changes and
reads the rest through to the ledger, so a trial costs what it places, not the size of the snapshot. The
chosen trial is committed into the ledger (its changes only). ``version`` counts commits and in-place
changes, and ``fleet_version`` only those that can change what one fleet can hold (its instances' blocks,
its instance count, its backend's cap, the shared host's blocks): what a pass learnt from a ledger (that a
kind of gang does not fit a fleet now) holds until the version it was learnt at moves. Within a pass
capacity only ever goes down.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field

from corral.scheduler.types import FleetSlot, Snapshot


class _Overlay(MutableMapping[str, int]):
    """Writes kept here, reads falling through to ``base`` (a trial's view of one of the ledger's maps)."""

    __slots__ = ("base", "changes")

    def __init__(self, base: Mapping[str, int]) -> None:
        self.base, self.changes = base, dict[str, int]()

    def __getitem__(self, key: str) -> int:
        changes = self.changes
        return changes[key] if key in changes else self.base[key]

    def get(self, key: str, default: int | None = None) -> int | None:  # type: ignore[override]
        changes = self.changes
        return changes[key] if key in changes else self.base.get(key, default)

    def __setitem__(self, key: str, value: int) -> None:
        self.changes[key] = value

    def __delitem__(self, key: str) -> None:
        raise TypeError("a ledger's entries are never removed")

    def __iter__(self) -> Iterator[str]:
        return iter({**self.base, **self.changes})

    def __len__(self) -> int:
        return len({**self.base, **self.changes})


@dataclass
class Ledger:
    free_blocks: MutableMapping[str, int] = field(default_factory=dict)
    fleet_count: MutableMapping[str, int] = field(default_factory=dict)
    backend_used: MutableMapping[str, int] = field(default_factory=dict)
    host_used: MutableMapping[str, int] = field(default_factory=dict)
    version: int = 0
    #: instance id -> its fleet's id (what a change of an instance's free blocks moves)
    fleet_of: dict[str, str] = field(default_factory=dict)
    #: ("f", fleet id) / ("b", backend cap key) / ("h", host backend) -> commits that changed it
    versions: dict[tuple[str, str], int] = field(default_factory=dict)

    def trial(self) -> Ledger:
        """An overlay of this ledger: writes stay in the overlay, reads fall through."""
        return Ledger(
            _Overlay(self.free_blocks),
            _Overlay(self.fleet_count),
            _Overlay(self.backend_used),
            _Overlay(self.host_used),
            self.version,
            self.fleet_of,
        )

    def commit(self, trial: Ledger) -> None:
        """Take a trial's changes (a trial of this ledger) into it."""
        changes: list[dict[str, int]] = []
        for mine, theirs in (
            (self.free_blocks, trial.free_blocks),
            (self.fleet_count, trial.fleet_count),
            (self.backend_used, trial.backend_used),
            (self.host_used, trial.host_used),
        ):
            assert isinstance(theirs, _Overlay) and theirs.base is mine, "commit takes a trial of this ledger"
            mine.update(theirs.changes)
            changes.append(theirs.changes)
        blocks, counts, capped, hosts = changes
        moved = {("f", self.fleet_of.get(i, "")) for i in blocks}
        moved |= {("f", f) for f in counts}
        moved |= {("b", k) for k in capped}
        moved |= {("h", b) for b in hosts}
        self._moved(moved)

    def changed(self, instance_ids: list[str]) -> None:
        """Say that these instances' free blocks were changed in place (taken back from idle instances)."""
        self._moved({("f", self.fleet_of.get(i, "")) for i in instance_ids})

    def _moved(self, keys: set[tuple[str, str]]) -> None:
        self.version += 1
        for k in keys:
            self.versions[k] = self.versions.get(k, 0) + 1

    def fleet_version(self, fleet: FleetSlot, host_backends: tuple[str, ...]) -> tuple[int, ...]:
        """What the ledger's changes to what ``fleet`` can hold add up to (``host_backends``: the shared
        hosts its offers are carved out of)."""
        v = self.versions
        key = fleet.backend_limit_key
        return (
            v.get(("f", fleet.id), 0),
            v.get(("b", key), 0) if key is not None else 0,
            *(v.get(("h", b), 0) for b in host_backends),
        )


def initial_ledger(snapshot: Snapshot) -> Ledger:
    ledger = Ledger()
    for fleet in snapshot.fleets:
        ledger.fleet_count[fleet.id] = len(fleet.instances)
        for inst in fleet.instances:
            ledger.free_blocks[inst.id] = max(0, inst.total_blocks - inst.busy_blocks)
            ledger.fleet_of[inst.id] = fleet.id
    for key, (used, _limit) in snapshot.backend_limits.items():
        ledger.backend_used[key] = used
    for backend, (used, _total) in snapshot.host_pools.items():
        ledger.host_used[backend] = used
    return ledger
