"""Instances a cloud took away, found through its API on every host check (``instance_check_interval``):
each backend that can say (``lost_instances``: AWS, one DescribeInstances per project and region) is asked
about its idle and busy rows; an instance it reports going or gone that corral did not terminate (a spot
interruption) is marked terminated and its jobs end ``interrupted_by_no_capacity`` -- in the same pass, not
after the agent's unreachable timeout -- so that a run whose ``retry.on_events`` has ``interruption`` is
resubmitted (``workers.runs``). A backend is asked even when none of its rows is live: Slurm's answer also
sweeps the files ended allocations left on a cluster's login node.

Load (live rows) → decide (the backend's rule, ``backends.aws.interruptions``) → act (the cloud's API, no
transaction open) → apply (one short transaction per instance, guarded by its status) → ``forget`` (the backend
drops its link to the row; Slurm cancels there an allocation it reported as reaching its time limit, so that its
jobs end with that reason, recorded first, and not with what their agents, stopped, report meanwhile).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from corral.backends.base import InterruptionSource
from corral.context import Context
from corral.domain.events import instance_target
from corral.domain.statuses import READY_INSTANCE
from corral.store import fleets as fleet_store
from corral.store import instance_outcomes
from corral.store.events import emit

log = logging.getLogger("corral.interruptions")


class Interruptions:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    async def pass_once(self) -> int:
        """One pass: the number of instances found lost (and recorded)."""
        asking = {n: c for n, c in self.ctx.computes.items() if isinstance(c, InterruptionSource)}
        if not asking:
            return 0
        async with self.ctx.db.read() as conn:
            ready = await fleet_store.list_instances(conn, statuses=READY_INSTANCE, backends=tuple(asking))
            live = [i for i in ready if i.agent]
        found = 0
        for name, compute in asking.items():
            mine = [i for i in live if i.backend == name]
            try:  # asked with none too: a backend's upkeep goes on (Slurm's sweep of ended jobs' files)
                gone = await compute.lost_instances(mine)
            except Exception as e:  # the cloud's API unreachable: the next pass asks again
                log.warning("asking %s which instances it took away failed: %s", name, e)
                continue
            by_id = {i.id: i for i in mine}
            for item in gone:
                inst = by_id.get(item.row_id)
                if inst is not None and await self._record(inst, item.message):
                    found += 1
                    await _forget(compute, inst.id)
        if found:
            self.ctx.wakeups.wake("runs", "scheduler", "jobs", "instances")
        return found

    async def _record(self, inst: Any, message: str) -> bool:
        now = time.time()
        async with self.ctx.db.write() as conn:
            # its running jobs end interrupted_by_no_capacity, its stopping ones end
            if not await instance_outcomes.record_lost(conn, inst.id, message, now):
                return False  # corral is terminating it meanwhile, or it is gone already
            await emit(conn, message, None, [instance_target(inst.project_id, inst.id, inst.name, inst.fleet_id)])
        log.warning(
            "instance %s of fleet %s: %s",
            inst.name,
            inst.fleet_name,
            message,
            extra={"event": "instance_interrupted", "instance": inst.name, "fleet": inst.fleet_name},
        )
        return True


async def _forget(compute: InterruptionSource, instance_id: str) -> None:
    try:
        await compute.forget(instance_id)
    except Exception as e:
        log.warning("dropping the link to lost instance %s failed: %s", instance_id, e)
