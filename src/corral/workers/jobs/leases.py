"""This replica's leases on the jobs it drives: taken once per job, extended while it follows the job, released
when it lets go (another replica takes over a job whose lease expired).

:class:`JobLeases` is a component the jobs driver holds and hands to its submissions and followers. It owns the
tokens this replica holds and until when; the lease columns themselves are written by :mod:`corral.store.leases`.

May import: corral.store (leases, tables, db).
"""

from __future__ import annotations

import time

from corral.store import leases
from corral.store.db import Database
from corral.store.tables import jobs as jobs_table


class JobLeases:
    """The leases ``replica_id`` holds on jobs, each taken for ``ttl`` seconds at a time."""

    def __init__(self, db: Database, replica_id: str, ttl: float) -> None:
        self.db = db
        self.replica_id = replica_id
        self.ttl = ttl
        self._tokens: dict[str, str] = {}
        self._until: dict[str, float] = {}

    def holds(self, job_id: str) -> bool:
        return job_id in self._tokens

    def adopt(self, job_id: str, token: str, until: float) -> None:
        """A lease taken for this replica elsewhere (its scheduler's commit), held from now on."""
        self._tokens[job_id] = token
        self._until[job_id] = until

    async def claim(self, job_id: str) -> str | None:
        """This replica's lease on a job (taken once, then kept by :meth:`keep`)."""
        token = self._tokens.get(job_id)
        if token is not None:
            return token
        now = time.time()
        async with self.db.write() as conn:
            token = await leases.claim(conn, jobs_table, job_id, self.replica_id, now, self.ttl)
        if token is not None:
            self.adopt(job_id, token, now + self.ttl)
        return token

    async def claim_many(self, job_ids: list[str], expect_status: tuple[str, ...]) -> set[str]:
        """New leases on those of ``job_ids`` that nobody holds and are still in ``expect_status``, taken in one
        transaction (the jobs a pass starts); the ids claimed. A job this replica holds already is left out:
        a task of its own drives it (the pass that listed it read it before that task moved it on)."""
        wanted = [j for j in job_ids if j not in self._tokens]
        if not wanted:
            return set()
        now = time.time()
        async with self.db.write() as conn:
            tokens = await leases.claim_many(conn, jobs_table, wanted, self.replica_id, now, self.ttl, expect_status)
        for job_id, token in tokens.items():
            self.adopt(job_id, token, now + self.ttl)
        return set(tokens)

    async def keep(self, job_id: str) -> bool:
        """Extend the lease when half of it has run out; False once another replica has taken the job."""
        token = self._tokens.get(job_id)
        if token is None:
            return False
        now = time.time()
        if self._until.get(job_id, 0) - now > self.ttl / 2:
            return True
        async with self.db.write() as conn:
            ok = await leases.extend(conn, jobs_table, job_id, token, now, self.ttl)
        if ok:
            self._until[job_id] = now + self.ttl
        else:
            self.drop(job_id)
        return ok

    def drop(self, job_id: str) -> None:
        """Forget the lease without writing (it was released with the job's end, or taken by another replica)."""
        self._tokens.pop(job_id, None)
        self._until.pop(job_id, None)

    async def release(self, job_id: str) -> None:
        token = self._tokens.get(job_id)
        self.drop(job_id)
        if token is not None:
            async with self.db.write() as conn:
                await leases.release(conn, jobs_table, job_id, token)
