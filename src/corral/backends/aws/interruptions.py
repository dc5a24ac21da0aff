"""Which live instances EC2 took away, pure: an instance a row holds as idle or busy that DescribeInstances
shows ``shutting-down`` or ``terminated`` was not terminated by corral (corral moves the row to
``terminating`` before it calls TerminateInstances) -- a spot interruption (StateReason
``Server.SpotInstanceTermination``), or someone else's TerminateInstances. Its jobs end
``interrupted_by_no_capacity`` (``workers.interruptions``).

An instance EC2 does not list (yet) is not taken for gone: Describe* are eventually consistent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: EC2 states of an instance that is going or gone.
GONE_STATES = ("shutting-down", "terminated")


@dataclass(frozen=True)
class Lost:
    """A row's instance that EC2 took away."""

    row_id: str
    instance_id: str
    state: str
    #: EC2's StateReason code (``Server.SpotInstanceTermination``, ``Client.UserInitiatedShutdown``...).
    reason: str
    spot: bool

    @property
    def message(self) -> str:
        what = "spot instance" if self.spot else "instance"
        why = f" ({self.reason})" if self.reason else ""
        return f"EC2 {what} {self.instance_id} is {self.state}{why}: interrupted, not terminated by corral"


def lost(watched: Mapping[str, str], described: Iterable[Mapping[str, Any]]) -> list[Lost]:
    """Those of ``described`` (DescribeInstances' instances) that ``watched`` (EC2 id -> row id of an idle
    or busy row) holds and that are going or gone."""
    out = []
    for inst in described:
        ec2_id = str(inst.get("InstanceId") or "")
        state = str((inst.get("State") or {}).get("Name") or "")
        if ec2_id not in watched or state not in GONE_STATES:
            continue
        reason = str((inst.get("StateReason") or {}).get("Code") or "")
        spot = inst.get("InstanceLifecycle") == "spot"
        out.append(Lost(watched[ec2_id], ec2_id, state, reason, spot))
    return out
