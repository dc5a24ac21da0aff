"""The reaper's rule, pure: which instances tagged with this server's id are orphans.

An orphan has no row, or a terminal one, and was launched longer than the grace ago (EC2 lists a new
instance before its launch's row is committed, and Describe* are eventually consistent). Instances without
this server's tag never reach this rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

LIVE_STATES = ("pending", "running", "stopping", "stopped")


@dataclass(frozen=True)
class Tagged:
    instance_id: str
    row_id: str
    state: str
    launched_at: float


def orphans(tagged: list[Tagged], row_status: Mapping[str, str], grace: float, now: float) -> list[Tagged]:
    """Those of ``tagged`` (live on EC2) whose row (``row_status``: row id -> status) is missing or
    ``terminated``, launched more than ``grace`` seconds before ``now``."""
    return [
        t
        for t in tagged
        if t.state in LIVE_STATES
        and row_status.get(t.row_id, "terminated") == "terminated"
        and now - t.launched_at > grace
    ]
