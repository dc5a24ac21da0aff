"""The orphan reaper of cloud backends: every ``orphan_interval``, per project with an ``aws`` backend and
per region it names, the instances tagged with this server's id whose row is missing or terminated and
older than ``CORRAL_ORPHAN_GRACE`` are terminated (or only reported: ``CORRAL_ORPHAN_ACTION=report``). The
rows are read after EC2 listed the instances, and only those the listing names.
A gateway's VM carries its gateway's id as its row: it is an orphan when that gateway's row is gone.
Instances without corral's server tag are never looked at. This server's placement groups that no live
instance names are deleted after the same grace (``backends.aws.gang_cleanup.sweep_groups``).

Load (rows and projects) → decide (``backends.aws.orphans``, pure) → act (EC2, no transaction open).
"""

from __future__ import annotations

import logging
import time

from corral.backends.aws.gang_cleanup import sweep_groups
from corral.context import Context
from corral.store import fleets as fleet_store
from corral.store import gateway_ops as gateway_store
from corral.store import project_state

log = logging.getLogger("corral.orphans")


class OrphanReaper:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._last: float | None = None

    async def pass_once(self, force: bool = False) -> int:
        """One pass when due (``force``: now); the number of orphans found."""
        now = time.time()
        if not force and self._last is not None and now - self._last < self.ctx.settings.orphan_interval:
            return 0
        self._last = now
        compute = self.ctx.computes.get("aws")
        if compute is None:
            return 0
        async with self.ctx.db.read() as conn:
            names = await project_state.names_naming_backend(conn, "aws")
        found = 0
        for name in names:
            project = await compute.project(name)  # type: ignore[attr-defined]
            # no regions configured: every region the backend offers, from the catalogue it prices from now
            regions = project.config.get("regions") or sorted(
                {r.region for r in compute.catalog.current().rows}  # type: ignore[attr-defined]
            )
            try:
                reaped = await compute.reap_orphans(  # type: ignore[attr-defined]
                    project, regions, self._statuses, self.ctx.settings.orphan_grace, self.ctx.settings.orphan_action
                )
            except Exception as e:  # EC2 unreachable: the next pass tries again
                log.warning("orphan pass of project %s failed: %s", name, e)
                continue
            found += len(reaped)
            try:  # placement groups of gangs that no instance holds any more
                await sweep_groups(
                    compute.session,  # type: ignore[attr-defined]
                    project, regions, self.ctx.settings.orphan_grace, self.ctx.settings.orphan_action == "report",
                )  # fmt: skip
            except Exception as e:
                log.warning("placement group pass of project %s failed: %s", name, e)
        return found

    async def _statuses(self, ids: list[str]) -> dict[str, str]:
        """The statuses of the rows ``ids`` as committed now (read after EC2 listed the instances): instance rows,
        and for the other ids, gateway rows (a gateway's VM)."""
        async with self.ctx.db.read() as conn:
            found = await fleet_store.instance_statuses(conn, ids)
            return {**await gateway_store.statuses(conn, [i for i in ids if i not in found]), **found}
