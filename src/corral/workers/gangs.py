"""Gangs of the instances worker: the pending instances of one multi-node run in a ``placement: cluster``
fleet, on a backend that launches gangs (``create_gang``: the aws backend), are provisioned together --
all leased, launched in one go, recorded each -- instead of each on its own. An instance that launches into
a capacity reservation (``reservation``) goes the same way, as a gang of one. If the gang cannot be
launched whole, none of it runs (the backend terminated what it launched). When EC2 had no room and the
run's ``retry`` covers ``no-capacity``, the gang waits whole: its rows stay reserved, its jobs say why, and
it is launched again every ``RETRY_INTERVAL`` seconds until ``retry.duration`` (from its reservation) has
passed. Otherwise every row and job of it ends alike: ``failed_to_start_due_to_no_capacity`` for
capacity, ``terminated_by_server`` for any other refusal (the run fails).

The instances worker lends :class:`Gangs` what it does for one instance too: claim its row's lease, keep it
renewed while the gang is launched, record it provisioned, record it failed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager

from corral.backends.base import Compute, GangLauncher, Provisioned, ProvisioningError
from corral.context import Context
from corral.domain.provisioning import FailureKind
from corral.domain.records import InstanceRec
from corral.store import leases
from corral.store.gangs import PendingGang, note_waiting, pending_gangs
from corral.store.tables import instances

log = logging.getLogger("corral.gangs")

NO_CAPACITY = "failed_to_start_due_to_no_capacity"
REFUSED = "terminated_by_server"
#: Seconds between two launches of a gang that waits for capacity.
RETRY_INTERVAL = 15.0

#: Claim an instance's lease: its token, or None when another replica holds it.
Claim = Callable[[InstanceRec], Awaitable[str | None]]
#: Record an instance provisioned, under its lease token.
Record = Callable[[InstanceRec, str, Compute, Provisioned], Awaitable[None]]
#: Record an instance that could not be provisioned (lease token, message, its jobs' termination reason).
Failed = Callable[[InstanceRec, str, str, str, FailureKind], Awaitable[None]]
#: Keep the leases (row id, token) renewed while the body runs.
Keep = Callable[[Sequence[tuple[str, str]]], AbstractAsyncContextManager[None]]


def waits(capacity: bool, reserved_at: float, wait: float | None, now: float) -> bool:
    """Whether a gang that could not be launched waits for capacity (else it fails)."""
    return capacity and wait is not None and now - reserved_at < wait


class Gangs:
    def __init__(self, ctx: Context, claim: Claim, record: Record, failed: Failed, keep: Keep) -> None:
        self.ctx = ctx
        self._claim = claim
        self._keep = keep
        self._record = record
        self._failed_one = failed
        #: Gang key -> when it may be launched again (it waits for capacity).
        self._not_before: dict[str, float] = {}
        #: Instances of gangs that wait for capacity now: nobody provisions them meanwhile.
        self.waiting: set[str] = set()

    async def start(self, pending: list[InstanceRec]) -> list[tuple[tuple[str, ...], asyncio.Task[None]]]:
        """Start provisioning the gangs among ``pending`` (instances no task holds yet); their ids and task."""
        launchers = {name: c for name, c in self.ctx.computes.items() if isinstance(c, GangLauncher)}
        capable = [i for i in pending if i.backend in launchers]
        if not capable:
            self.waiting = set()
            return []  # no query in the common case
        async with self.ctx.db.read() as conn:
            gangs = await pending_gangs(conn, [i.id for i in capable])
        by_id = {i.id: i for i in capable}
        now = time.time()
        due = [g for g in gangs if self._not_before.get(g.key, 0.0) <= now]
        self.waiting = {i for g in gangs if g not in due for i in g.instance_ids}
        return [
            (g.instance_ids, asyncio.create_task(self._provision(launchers, [by_id[i] for i in g.instance_ids], g)))
            for g in due
        ]

    async def _provision(
        self, launchers: Mapping[str, GangLauncher], rows: list[InstanceRec], gang: PendingGang
    ) -> None:
        tokens: list[str] = []
        for r in rows:
            token = await self._claim(r)
            if token is None:  # another replica has (part of) it
                async with self.ctx.db.write() as conn:
                    for held, t in zip(rows, tokens, strict=False):
                        await leases.release(conn, instances, held.id, t)
                return
            tokens.append(token)
        compute = self.ctx.computes[rows[0].backend]
        names = ", ".join(r.name for r in rows)
        try:
            async with self._keep([(r.id, t) for r, t in zip(rows, tokens, strict=True)]):
                provisioned = await launchers[rows[0].backend].create_gang(rows, gang.cluster, gang.reservation)
        except ProvisioningError as e:
            capacity = bool(getattr(e, "capacity", False))
            if waits(capacity, min(r.created_at for r in rows), gang.wait, time.time()):
                self._not_before[gang.key] = time.time() + RETRY_INTERVAL
                async with self.ctx.db.write() as conn:
                    await note_waiting(conn, [r.id for r in rows], f"waiting for capacity: {e}")
                    for r, t in zip(rows, tokens, strict=True):
                        await leases.release(conn, instances, r.id, t)
                log.info("gang %s waits for capacity: %s", names, e)
                return
            self._not_before.pop(gang.key, None)
            reason = NO_CAPACITY if capacity else REFUSED
            message = f"the gang ({names}) could not be launched whole: {e}"
            await self._failed(rows, tokens, message, reason, e.kind)
            return
        except Exception as e:  # never leave a gang stuck in pending
            log.exception("provisioning the gang %s failed", names)
            await self._failed(rows, tokens, f"unexpected error launching the gang ({names}): {e}", REFUSED, "refused")
            return
        self._not_before.pop(gang.key, None)
        log.info("gang %s (%s) launched together", names, gang.key, extra={"event": "gang_launched"})
        for r, t, p in zip(rows, tokens, provisioned, strict=False):
            await self._record(r, t, compute, p)

    async def _failed(
        self, rows: list[InstanceRec], tokens: list[str], message: str, reason: str, kind: FailureKind
    ) -> None:
        for r, t in zip(rows, tokens, strict=False):
            await self._failed_one(r, t, message, reason, kind)
