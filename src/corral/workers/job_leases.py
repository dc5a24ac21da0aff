"""This replica's leases on the jobs it drives: taken once per job, extended while it follows the job,
released when it lets go (another replica takes over a job whose lease expired).

:class:`JobLeases` is a base of :class:`corral.workers.jobs.Jobs`, which sets ``ctx``, ``_leases`` and
``_lease_until``.
"""

from __future__ import annotations

import time

from corral.context import Context
from corral.store import leases
from corral.store.tables import jobs as jobs_table


class JobLeases:
    ctx: Context
    _leases: dict[str, str]
    _lease_until: dict[str, float]

    async def _claim(self, job_id: str) -> str | None:
        """This replica's lease on a job (taken once, then kept by ``_keep``)."""
        token = self._leases.get(job_id)
        if token is not None:
            return token
        now = time.time()
        async with self.ctx.db.write() as conn:
            token = await leases.claim(
                conn, jobs_table, job_id, self.ctx.replica_id, now, self.ctx.settings.job_lease_ttl
            )
        if token is not None:
            self._leases[job_id] = token
            self._lease_until[job_id] = now + self.ctx.settings.job_lease_ttl
        return token

    async def _claim_many(self, job_ids: list[str], expect_status: tuple[str, ...]) -> set[str]:
        """New leases on those of ``job_ids`` that nobody holds and are still in ``expect_status``, taken in one
        transaction (the jobs a pass starts); the ids claimed. A job this replica holds already is left out:
        a task of its own drives it (the pass that listed it read it before that task moved it on)."""
        wanted = [j for j in job_ids if j not in self._leases]
        if not wanted:
            return set()
        now = time.time()
        ttl = self.ctx.settings.job_lease_ttl
        async with self.ctx.db.write() as conn:
            tokens = await leases.claim_many(conn, jobs_table, wanted, self.ctx.replica_id, now, ttl, expect_status)
        for job_id, token in tokens.items():
            self._leases[job_id] = token
            self._lease_until[job_id] = now + ttl
        return set(tokens)

    async def _keep(self, job_id: str) -> bool:
        """Extend the lease when half of it has run out; False once another replica has taken the job."""
        token = self._leases.get(job_id)
        if token is None:
            return False
        now = time.time()
        if self._lease_until.get(job_id, 0) - now > self.ctx.settings.job_lease_ttl / 2:
            return True
        async with self.ctx.db.write() as conn:
            ok = await leases.extend(conn, jobs_table, job_id, token, now, self.ctx.settings.job_lease_ttl)
        if ok:
            self._lease_until[job_id] = now + self.ctx.settings.job_lease_ttl
        else:
            self._drop_lease(job_id)
        return ok

    def _drop_lease(self, job_id: str) -> None:
        self._leases.pop(job_id, None)
        self._lease_until.pop(job_id, None)

    async def _release(self, job_id: str) -> None:
        token = self._leases.get(job_id)
        self._drop_lease(job_id)
        if token is not None:
            async with self.ctx.db.write() as conn:
                await leases.release(conn, jobs_table, job_id, token)
