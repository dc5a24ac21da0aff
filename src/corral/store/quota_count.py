"""A gang counted against its project's ``quota.max`` at the commit point (``store/plan_apply.py``, its only user,
which holds the project's advisory lock while it counts).

The project's holding is counted whole once per commit; each gang then recounts only the instances it writes,
before and after its writes (what it adds is the difference), and the total is carried to the project's next gang
(``held``). Nothing else adds to a project's holding meanwhile: only commits do, under the project's lock; a job's
end elsewhere can only leave the carried total high, never low.

Imports SQLAlchemy, the tables, the quotas store and ``corral.domain``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.quotas import Limits, Usage
from corral.scheduler.types import Assign, Gang
from corral.store import quotas as quota_store
from corral.store.tables import instances, jobs


@dataclass
class QuotaCount:
    """One gang counted against its project's ``quota.max``: what the project held on the instances the gang
    assigns to before its writes (``there``), and the project's holding after them (``after``)."""

    project_id: str
    limits: Limits
    touched: list[str]
    there: Usage
    after: Usage = field(default_factory=dict)

    @staticmethod
    async def start(
        conn: AsyncConnection, gang: Gang, limits: Limits | None, held: dict[str, Usage]
    ) -> QuotaCount | None:
        """Before the gang's writes (None: its project has no ``quota.max``)."""
        if limits is None or gang.project_id is None:
            return None
        if gang.project_id not in held:
            held[gang.project_id] = await holding(conn, gang.project_id)
        touched = sorted({d.instance_id for d in gang.decisions if isinstance(d, Assign)})
        there = await holding(conn, gang.project_id, touched) if touched else {}
        return QuotaCount(gang.project_id, limits, touched, there)

    async def still_within(self, conn: AsyncConnection, held: dict[str, Usage], reserved: list[str]) -> bool:
        """After the gang's writes (``reserved``: the instances it made): whether no dimension of the max is above
        it and grew with them."""
        before = held[self.project_id]
        self.after = moved(before, self.there, await holding(conn, self.project_id, self.touched + reserved))
        return not grows_above(before, self.after, self.limits)


async def holding(conn: AsyncConnection, project_id: str, instance_ids: list[str] | None = None) -> Usage:
    """What the project's holding jobs hold (on ``instance_ids`` only, if given), from their rows."""
    where = jobs.c.project_id == project_id
    if instance_ids is not None:
        where = sa.and_(where, instances.c.id.in_(instance_ids))
    held = quota_store.holdings_of(await quota_store.held_on_instances(conn, where)).get(project_id)
    return dict(held.usage) if held is not None else {}


def moved(total: Usage, was: Usage, now: Usage) -> Usage:
    """``total`` with a part of it that was ``was`` now ``now`` (the instances' count alike: the parts are counted
    over the same instances, which the rest of the total does not hold jobs on)."""
    out = dict(total)
    for dim in {*was, *now}:
        out[dim] = out.get(dim, 0.0) - was.get(dim, 0.0) + now.get(dim, 0.0)
    return out


def grows_above(before: Usage, after: Usage, limits: Limits) -> bool:
    """Whether a dimension of ``limits`` is above its max after the gang's writes and grew with them."""
    eps = 1e-9
    return any(
        after.get(dim, 0.0) > cap + eps and after.get(dim, 0.0) > before.get(dim, 0.0) + eps
        for dim, cap in limits.amounts.items()
    )
