"""The queue as the scheduling worker reads it, pass after pass: what changed since the last read.

A pass reads the queue's state, ``(id, priority, status message)`` of each waiting job, from the queue's own
index (``ix_jobs_queued``: no table rows, no sort, its size the queue's), and compares it with the state it
read before as sets, in C: only the jobs that came, changed or went are handled one by one, and only the new
ones are read whole (with their scheduling facts; their documents only where they have none). A queue of
thousands behind a full fleet costs one narrow query and a few set operations per pass, not a row and a
comparison per job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.job_facts import PREFIX, decode
from corral.store.snapshot import QueueRow, waiting_query
from corral.store.tables import QUEUED_SQL, jobs, runs, users

#: A waiting job's state: what may change while it waits.
State = tuple[str, int, "str | None"]

#: The queue's state. SQLite's planner prefers ``ix_jobs_instance_status``, which finds the same rows but
#: reads each from the table (four times slower for a queue of 1,000 jobs): it is told which index to read.
_QUEUE_STATE = {
    "sqlite": f"SELECT id, priority, status_message FROM jobs INDEXED BY ix_jobs_queued WHERE {QUEUED_SQL}",
    "postgresql": f"SELECT id, priority, status_message FROM jobs WHERE {QUEUED_SQL}",
}


async def _queue_state(conn: AsyncConnection) -> set[State]:
    """The queue's state, read by the driver itself in the caller's transaction: SQLAlchemy's result rows
    cost more than the query for a long queue (2.4 ms against 1.2 for 2,000 jobs on SQLite), and this read
    is made on every pass."""
    driver: Any = (await conn.get_raw_connection()).driver_connection
    if conn.dialect.name == "sqlite":  # aiosqlite's connection (made in place: ``sqlite_inline``)
        return set(await driver.execute_fetchall(_QUEUE_STATE["sqlite"]))
    return set(map(tuple, await driver.fetch(_QUEUE_STATE["postgresql"])))  # asyncpg's


@dataclass(frozen=True)
class QueueChange:
    """What one read found against the one before."""

    #: Jobs first seen, read whole (with their documents), oldest first.
    fresh: list[QueueRow]
    #: The new state of the jobs seen before whose priority or status message changed.
    changed: list[State]
    #: Ids of the jobs that left the queue.
    gone: list[str]


@dataclass
class QueueReader:
    """The queue's state as last read: each waiting job's by id, and all of it as a set."""

    known: dict[str, State] = field(default_factory=dict)
    _state: set[State] = field(default_factory=set)

    async def read(self, conn: AsyncConnection) -> QueueChange:
        state = await _queue_state(conn)
        came = state - self._state  # new jobs, and jobs whose priority or message changed
        went = self._state - state
        known = self.known
        gone = list({s[0] for s in went}.difference(s[0] for s in came))
        for job_id in gone:
            del known[job_id]
        changed = [s for s in came if s[0] in known]
        unknown = [s[0] for s in came if s[0] not in known]
        known.update((s[0], s) for s in changed)
        fresh = await _read_whole(conn, unknown)
        known.update((r.id, (r.id, r.priority, r.status_message)) for r in fresh)
        missing = set(unknown).difference(r.id for r in fresh)
        if missing:  # placed or removed between the two reads: the next read sees them as they are then
            state = {s for s in state if s[0] not in missing}
        self._state = state
        fresh.sort(key=lambda r: (r.submitted_at, r.id))
        return QueueChange(fresh, changed, gone)

    def forget(self, job_id: str) -> None:
        """Read ``job_id`` whole again on the next read, should it still wait (its documents could not be
        used: the pass failed it, and the failure may not have been committed)."""
        seen = self.known.pop(job_id, None)
        if seen is not None:
            self._state.discard(seen)


#: A job's documents, read only when its scheduling facts are missing or of another version (to derive them).
_WITHOUT_FACTS = sa.or_(jobs.c.scheduling_facts.is_(None), sa.not_(jobs.c.scheduling_facts.startswith(PREFIX)))


#: Built once (``store/prebuilt.py`` says why): a pass reads the jobs first seen, after every apply.
_WHOLE = (
    waiting_query()
    .add_columns(
        jobs.c.replica_num,
        jobs.c.scheduling_facts,
        sa.case((_WITHOUT_FACTS, jobs.c.job_spec)).label("job_spec"),
        sa.case((_WITHOUT_FACTS, runs.c.run_spec)).label("run_spec"),
        users.c.global_role,
    )
    .join(runs, runs.c.id == jobs.c.run_id)
    .join(users, users.c.id == runs.c.user_id)
    .where(jobs.c.id.in_(sa.bindparam("ids", expanding=True)))
    .order_by(None)
)


async def _read_whole(conn: AsyncConnection, ids: list[str]) -> list[QueueRow]:
    """The queue's rows of ``ids`` (those still waiting) with their scheduling facts, or their documents for a
    job stored without facts this code reads, 500 per query."""
    out: list[QueueRow] = []
    for start in range(0, len(ids), 500):
        out.extend(_row(d) for d in await conn.execute(_WHOLE, {"ids": ids[start : start + 500]}))
    return out


def _row(d: Any) -> QueueRow:
    facts = decode(d.scheduling_facts) if d.job_spec is None else None
    return QueueRow(
        d.id,
        d.run_id,
        d.project_id,
        d.project_name,
        d.run_name,
        d.job_num,
        d.priority,
        d.submitted_at,
        d.status_message,
        None if d.job_spec is None else orjson.loads(d.job_spec),
        None if d.run_spec is None else orjson.loads(d.run_spec),
        d.global_role,
        d.queued_at,
        facts,
        d.replica_num,
    )
