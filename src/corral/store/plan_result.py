"""What a commit of ``plan_apply`` did (:class:`ApplyResult`), and whom it leases the jobs it places on a ready
instance to (:class:`JobLease`).

Imports nothing of corral.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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

    @property
    def changed(self) -> bool:
        return bool(self.assigned or self.reserved or self.failed or self.reclaimed)


@dataclass(frozen=True)
class JobLease:
    """Who starts the jobs a commit places on a ready instance (its agent answers): the committing replica, which
    then holds their lease (``ttl`` seconds) from the commit on, as if it had claimed them."""

    owner: str
    ttl: float
