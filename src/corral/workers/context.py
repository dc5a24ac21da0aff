"""What every worker shares: settings, the database, the backends, and the wake-up events."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from corral.backends.base import Compute
from corral.domain.records import InstanceRec
from corral.settings import Settings
from corral.store.db import Database

WORKERS = ("scheduler", "instances", "jobs", "runs")


class Wakeups:
    """In-process wake-ups: a service or worker that changed something wakes whoever acts on it.

    (Across Postgres replicas the same calls will also NOTIFY; on SQLite there is one process.)
    """

    def __init__(self) -> None:
        self._events = {name: asyncio.Event() for name in WORKERS}

    def wake(self, *names: str) -> None:
        for name in names or WORKERS:
            self._events[name].set()

    def event(self, name: str) -> asyncio.Event:
        return self._events[name]


@dataclass
class Context:
    settings: Settings
    db: Database
    computes: dict[str, Compute]
    wakeups: Wakeups = field(default_factory=Wakeups)

    def compute(self, backend: str) -> Compute:
        return self.computes[backend]

    def agent_url(self, inst: InstanceRec) -> str:
        """Where ``inst``'s agent answers now, as its backend says (an SSH host: the local end of a tunnel)."""
        compute = self.computes.get(inst.backend)
        if compute is None:
            return str((inst.agent or {}).get("url") or "")
        return compute.agent_url(inst)
