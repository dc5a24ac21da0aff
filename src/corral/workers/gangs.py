"""Gangs of the instances worker: the pending instances of one multi-node run in a ``placement: cluster``
fleet, on a backend that launches gangs (``create_gang``: the aws backend), are provisioned together --
all leased, launched in one go, recorded each -- instead of each on its own. If the gang cannot be
launched whole, none of it runs (the backend terminated what it launched) and every row and job of it
ends alike: ``failed_to_start_due_to_no_capacity`` when EC2 had no room (the run's ``retry`` on
``no-capacity`` makes it wait and try again), ``terminated_by_server`` otherwise (the run fails).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from corral.backends.base import ProvisioningError
from corral.domain.records import InstanceRec
from corral.store import leases
from corral.store.gangs import PendingGang, pending_gangs
from corral.store.tables import instances

if TYPE_CHECKING:
    from corral.workers.instances import Instances

log = logging.getLogger("corral.gangs")

NO_CAPACITY = "failed_to_start_due_to_no_capacity"
REFUSED = "terminated_by_server"


class Gangs:
    def __init__(self, owner: Instances) -> None:
        self.owner = owner
        self.ctx = owner.ctx

    async def start(self, pending: list[InstanceRec]) -> list[tuple[tuple[str, ...], asyncio.Task[None]]]:
        """Start provisioning the gangs among ``pending`` (instances no task holds yet); their ids and task."""
        capable = [i for i in pending if hasattr(self.ctx.computes.get(i.backend), "create_gang")]
        if len(capable) < 2:
            return []  # no query in the common case
        async with self.ctx.db.read() as conn:
            gangs = await pending_gangs(conn, [i.id for i in capable])
        by_id = {i.id: i for i in capable}
        return [
            (g.instance_ids, asyncio.create_task(self._provision([by_id[i] for i in g.instance_ids], g))) for g in gangs
        ]

    async def _provision(self, rows: list[InstanceRec], gang: PendingGang) -> None:
        tokens: list[str] = []
        for r in rows:
            token = await self.owner._claim(r)
            if token is None:  # another replica has (part of) it
                async with self.ctx.db.write() as conn:
                    for held, t in zip(rows, tokens, strict=False):
                        await leases.release(conn, instances, held.id, t)
                return
            tokens.append(token)
        compute: Any = self.ctx.computes[rows[0].backend]
        names = ", ".join(r.name for r in rows)
        try:
            provisioned = await compute.create_gang(rows, True, gang.reservation)
        except ProvisioningError as e:
            reason = NO_CAPACITY if getattr(e, "capacity", False) else REFUSED
            await self._failed(rows, tokens, f"the gang ({names}) could not be launched whole: {e}", reason)
            return
        except Exception as e:  # never leave a gang stuck in pending
            log.exception("provisioning the gang %s failed", names)
            await self._failed(rows, tokens, f"unexpected error launching the gang ({names}): {e}", REFUSED)
            return
        log.info("gang %s of run %s launched together", names, gang.run_id, extra={"event": "gang_launched"})
        for r, t, p in zip(rows, tokens, provisioned, strict=False):
            await self.owner.record(r, t, compute, p)

    async def _failed(self, rows: list[InstanceRec], tokens: list[str], message: str, reason: str) -> None:
        for r, t in zip(rows, tokens, strict=False):
            await self.owner._provisioning_failed(r, t, message, reason)
