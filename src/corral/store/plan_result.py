"""What a commit of ``plan_apply`` did (:class:`ApplyResult`), whom it leases the jobs it places on a ready
instance to (:class:`JobLease`), and who settles the run of a job it places (:class:`RunSettler`).

Imports nothing of corral.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncConnection


@dataclass
class ApplyResult:
    assigned: list[str] = field(default_factory=list)
    reserved: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    rejected_runs: list[str] = field(default_factory=list)
    #: Idle instances set terminating to free the host they were carved out of.
    reclaimed: list[str] = field(default_factory=list)
    #: Job id -> the token of the lease taken on it for ``apply_plan``'s ``lease`` owner (jobs placed on a ready
    #: instance: that replica starts them without claiming them again).
    leased: dict[str, str] = field(default_factory=dict)
    #: The runs of placed jobs whose status the commit's ``settle`` settled in its transaction (the runs worker
    #: need not be woken for them).
    settled_runs: set[str] = field(default_factory=set)

    @property
    def changed(self) -> bool:
        return bool(self.assigned or self.reserved or self.failed or self.reclaimed)


@dataclass(frozen=True)
class JobLease:
    """Who starts the jobs a commit places on a ready instance (its agent answers): the committing replica, which
    then holds their lease (``ttl`` seconds) from the commit on, as if it had claimed them."""

    owner: str
    ttl: float


class RunSettler(Protocol):
    """Settles the status of the run of a job ``apply_plan`` has just placed, in the commit's own write transaction
    (``conn``), as the runs worker would; whether it did (False: the run is left to the runs worker). It must never
    wait for the run's row (another transaction holding it: False), and writes no capacity."""

    async def __call__(self, conn: AsyncConnection, run_id: str, now: float) -> bool: ...
