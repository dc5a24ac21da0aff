"""What a run costs, as dstack 0.22.5 computes it (``server/services/runs/__init__.py``: ``_get_run_cost`` and
``_get_job_submission_cost``; ``core/models/runs.py``: ``JobSubmission.duration``): the sum over its jobs'
submissions of the submission's price ($/hour) times its duration in hours, rounded to 4 decimals; a submission
that never got an instance (no ``job_provisioning_data``) costs nothing, and one still going counts up to now.

One deliberate difference: dstack's duration starts at the submission's ``submitted_at``, because there a
submission gets its instance at once or fails. A corral job may wait in the queue first; it is charged from
the moment it is placed (``placed_at``, when its price is recorded), not for the wait.

The price is the instance's at the moment the job is placed (stored with the job, so that a catalogue change
never rewrites history); jobs on local and SSH hosts are placed at price 0. Pure: ``now`` is a parameter.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol

#: corral's backends whose hosts bill nothing: this machine, and SSH hosts the user already has.
FREE_BACKENDS = frozenset({"local", "ssh"})


class Billed(Protocol):
    """What the cost reads of a job submission (``JobRec`` has these)."""

    @property
    def price(self) -> float | None: ...

    @property
    def placed_at(self) -> float | None: ...

    @property
    def finished_at(self) -> float | None: ...

    @property
    def job_provisioning_data(self) -> object | None: ...


def placed_price(backend: str, price: float | None) -> float:
    """The price ($/hour) a job placed on an instance of ``backend`` priced ``price`` is charged."""
    if backend in FREE_BACKENDS or price is None:
        return 0.0
    return float(price)


def submission_cost(sub: Billed, now: float) -> float:
    """One submission's cost: 0 until it got an instance (or when stored before prices were: no price)."""
    if sub.job_provisioning_data is None or sub.price is None or sub.placed_at is None:
        return 0.0
    end = sub.finished_at if sub.finished_at is not None else now
    return sub.price * max(0.0, end - sub.placed_at) / 3600


def run_cost(subs: Iterable[Billed], now: float) -> float:
    """A run's cost: the sum over the submissions given (those the answer shows, as dstack's), to 4 decimals."""
    return round(math.fsum(submission_cost(s, now) for s in subs), 4)
