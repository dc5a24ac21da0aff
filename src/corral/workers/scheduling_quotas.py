"""The scheduling pass's view of the projects' policies: each project's ``quota.max`` with what it holds
(``Snapshot.quotas``), and the weights, nominal quotas and holdings fair sharing orders by
(``Snapshot.shares``). A server with no policy loads nothing more and schedules as before."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from corral.domain.quotas import Limits, QuotaPolicy
from corral.scheduler.types import FairShare, ProjectQuota
from corral.store import quotas as quota_store
from corral.store.fleet_reader import State
from corral.store.holdings_reader import HoldingsReader


async def load_policies(
    conn: Any, holdings_reader: HoldingsReader, live: Iterable[State], whole: bool
) -> tuple[dict[str, QuotaPolicy], dict[str, quota_store.Holding]]:
    """Every stored policy and, once there is one, every project's holding (fair sharing counts them all), read
    again only where an instance of ``live`` (the live instances' state read in this transaction) moved, or every
    instance with ``whole``."""
    policies = await quota_store.all_policies(conn)
    holdings = await holdings_reader.read(conn, live, whole) if policies else {}
    return policies, holdings


def project_quotas(
    policies: dict[str, QuotaPolicy], holdings: dict[str, quota_store.Holding], names: dict[str, str]
) -> dict[str, ProjectQuota]:
    """The scheduler's view of the projects with a ``quota.max``: the max and what they hold now."""
    out: dict[str, ProjectQuota] = {}
    for pid, limits in ((pid, p.max) for pid, p in policies.items() if not p.max.is_empty()):
        held = holdings.get(pid)
        out[pid] = ProjectQuota(
            limits,
            dict(held.usage) if held else {},
            held.instance_ids if held else frozenset(),
            names.get(pid, ""),
        )
    return out


def project_shares(
    policies: dict[str, QuotaPolicy], holdings: dict[str, quota_store.Holding], queued: set[str]
) -> dict[str, FairShare]:
    """Fair sharing between the projects with queued jobs, once any project has a policy (none: {})."""
    if not policies:
        return {}
    out: dict[str, FairShare] = {}
    for pid in queued:
        policy = policies.get(pid)
        held = holdings.get(pid)
        out[pid] = FairShare(
            weight=policy.weight if policy is not None else 1.0,
            nominal=policy.nominal if policy is not None else Limits(),
            used=dict(held.usage) if held is not None else {},
            instance_ids=held.instance_ids if held is not None else frozenset(),
        )
    return out
