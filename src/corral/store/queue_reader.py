"""The queue as the scheduling worker reads it, pass after pass: what changed since the last read.

Triggers on ``jobs`` write a row to ``queue_changes`` for each job that comes into the queue, leaves it or
whose priority or status message changes while it waits (migration 0050). A pass reads the log's
rows after its mark, then the state of the jobs they name: a pass over a queue of 100,000 jobs behind a full
fleet costs what changed, not the queue's length.

- **SQLite** runs one write transaction at a time, so the log's ``seq`` grows in commit order: the mark is
  the last row read. The reader prunes the log behind it and keeps that row; a reader that finds its row
  gone reads the queue's state whole.
- **Postgres** commits concurrent transactions out of the order of their ids and sequence values. Each row
  carries its transaction's id, and the mark is the oldest transaction still running at the last read:
  every transaction below it had ended then, so reading the rows of transactions from the mark on misses
  nothing (and reads some twice; a job's state is compared, so a change is told once). A prune deletes the
  rows of transactions below a bound and leaves a marker with that bound: a reader whose mark is below it
  reads the queue's state whole.

A first read, and one after a prune passed the mark, reads each waiting job's ``(id, priority, status
message)`` from the queue's own index (``ix_jobs_queued``: no table rows, no sort, its size the queue's) and
compares it with the state known. Either way only the jobs that came, changed or went
are handled one by one, and only the new ones are read whole (with their scheduling facts; their documents
only where they have none).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.job_facts import PREFIX, decode
from corral.store.snapshot import QueueRow, waiting_columns
from corral.store.tables import QUEUED_SQL, jobs, queue_changes, runs, users
from corral.store.unindexed import unindexed

#: A waiting job's state: what may change while it waits.
State = tuple[str, int, "str | None"]

#: The queue's state. SQLite's planner prefers ``ix_jobs_instance_status``, which finds the same rows but
#: reads each from the table (four times slower for a queue of 1,000 jobs): it is told which index to read.
_QUEUE_STATE = {
    "sqlite": f"SELECT id, priority, status_message FROM jobs INDEXED BY ix_jobs_queued WHERE {QUEUED_SQL}",
    "postgresql": f"SELECT id, priority, status_message FROM jobs WHERE {QUEUED_SQL}",
}
#: The state of the waiting jobs among some, from the same index (SQLite: a JSON list of ids; Postgres: an array).
_STATE_OF = {
    "sqlite": f"{_QUEUE_STATE['sqlite']} AND id IN (SELECT value FROM json_each(?))",
    "postgresql": f"{_QUEUE_STATE['postgresql']} AND id = ANY($1::text[])",
}
#: SQLite: the queue's changes from a mark (a ``seq``) on.
_CHANGES_FROM = "SELECT seq, job_id FROM queue_changes WHERE seq >= ? ORDER BY seq"
_LAST_CHANGE = "SELECT max(seq) FROM queue_changes"
#: Postgres: the oldest transaction still running, as a number: every transaction below it has ended.
_XMIN = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint"
#: Postgres: the jobs changed by transactions from a mark (an ``_XMIN``) on, and the prunes' markers there.
_CHANGED_FROM = "SELECT DISTINCT job_id FROM queue_changes WHERE txid >= $1"
#: Postgres: a prune's marker, whose ``txid`` is the transaction id below which it pruned.
PRUNED = ""
#: Changes read before the log's oldest rows are pruned (by the reader: ``prune_due``).
PRUNE_AFTER = 20_000


async def _driver(conn: AsyncConnection) -> Any:
    """The driver's own connection (aiosqlite's, made in place by ``sqlite_inline``, or asyncpg's): SQLAlchemy's
    result rows cost more than these narrow queries (2.4 ms against 1.2 for the state of 2,000 jobs on SQLite),
    made on every pass."""
    return (await conn.get_raw_connection()).driver_connection


async def _queue_state(conn: AsyncConnection) -> list[State]:
    """The queue's state, read by the driver itself in the caller's transaction."""
    driver = await _driver(conn)
    if conn.dialect.name == "sqlite":
        return list(await driver.execute_fetchall(_QUEUE_STATE["sqlite"]))
    return [(r[0], r[1], r[2]) for r in await driver.fetch(_QUEUE_STATE["postgresql"])]


async def _changes_since(conn: AsyncConnection, mark: int) -> tuple[set[str], int] | None:
    """SQLite: the jobs whose place in the queue changed after change ``mark`` (0: none read yet), and the last
    change; None where the log no longer holds the changes from there (pruned past the mark). One write
    transaction at a time makes ``seq`` grow in commit order: every change committed before this read's
    snapshot has a ``seq`` at most its last, and none after it."""
    rows = await (await _driver(conn)).execute_fetchall(_CHANGES_FROM, (mark,))
    if (rows and rows[0][0] != max(mark, 1)) or (not rows and mark > 0):  # its own row gone: pruned past it
        return None
    return {r[1] for r in rows if r[0] > mark}, rows[-1][0] if rows else mark


async def _changed_since(conn: AsyncConnection, mark: int) -> tuple[set[str], int] | None:
    """Postgres: the jobs changed by the transactions from ``mark`` on (the oldest one running at the last
    read), and the new mark; None where a prune passed the mark. Concurrent transactions commit out of the
    order of their ids, but each one below the oldest still running has ended: read from the mark taken
    before the last read, the log names every change committed since (some again: a job's state is
    compared, so a change read twice is told once)."""
    driver = await _driver(conn)
    xmin = await driver.fetchval(_XMIN)  # before the log's read: a transaction ending in between is read again
    ids = {r[0] for r in await driver.fetch(_CHANGED_FROM, mark)}
    if PRUNED in ids:
        return None
    return ids, xmin


async def _states_of(conn: AsyncConnection, ids: set[str]) -> dict[str, State]:
    """The state of those of ``ids`` that wait in the queue."""
    driver = await _driver(conn)
    if conn.dialect.name == "sqlite":
        rows = await driver.execute_fetchall(_STATE_OF["sqlite"], (orjson.dumps(list(ids)).decode(),))
    else:
        rows = await driver.fetch(_STATE_OF["postgresql"], list(ids))
    return {r[0]: (r[0], r[1], r[2]) for r in rows}


async def _mark_now(conn: AsyncConnection) -> int:
    """Where a read of the whole state starts the log from: SQLite's last change, Postgres' oldest transaction
    running (taken before the state is read)."""
    driver = await _driver(conn)
    if conn.dialect.name == "sqlite":
        (row,) = await driver.execute_fetchall(_LAST_CHANGE)
        return int(row[0] or 0)
    return int(await driver.fetchval(_XMIN))


async def prune(conn: AsyncConnection, upto: int) -> None:
    """Delete the queue's changes before ``upto`` (``prune_due``'s). SQLite: before that ``seq``, the pruning
    reader's mark, whose own row stays: a reader whose row is gone reads the queue's state whole. Postgres:
    those of transactions below that id, leaving a marker that tells a reader from an older mark to do the
    same."""
    if conn.dialect.name == "sqlite":
        await conn.execute(sa.delete(queue_changes).where(queue_changes.c.seq < upto))
        return
    await conn.execute(sa.delete(queue_changes).where(queue_changes.c.txid < upto))
    await conn.execute(sa.insert(queue_changes).values(job_id=PRUNED, txid=upto))


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
    """The queue's state as last read, each waiting job's by id, and the mark in the log of the queue's changes
    (``queue_changes``) the next read goes on from."""

    known: dict[str, State] = field(default_factory=dict)
    #: Where the next read goes on from in the log (SQLite: the last ``queue_changes`` row read; Postgres: the
    #: oldest transaction running at the last read); None: the next read reads the queue's state whole.
    _mark: int | None = None
    #: The database's dialect, as the last read saw it.
    _dialect: str = "sqlite"
    #: Changes read since this reader last pruned the log, and its mark then.
    _read_since_prune: int = 0
    _pruned_at: int = 0
    #: Jobs the next read looks at whatever the log says (forgotten, or gone between a read's two queries).
    _again: set[str] = field(default_factory=set)

    async def read(self, conn: AsyncConnection) -> QueueChange:
        """What changed since the last read: of the jobs the log names since the mark (the queue's state
        whole on the first read, and after a prune passed the mark)."""
        self._dialect = conn.dialect.name
        since = None
        if self._mark is not None:
            since = await (_changes_since if self._dialect == "sqlite" else _changed_since)(conn, self._mark)
        if since is None:  # every waiting job's state, against every one known
            self._mark = await _mark_now(conn)
            now = {s[0]: s for s in await _queue_state(conn)}
            ids = now.keys() | self.known.keys()
        else:
            ids, self._mark = since
            self._read_since_prune += len(ids)
            ids |= self._again
            now = await _states_of(conn, ids) if ids else {}
        self._again.clear()
        came, went = set[State](), set[State]()
        for job_id in ids:
            old, new = self.known.get(job_id), now.get(job_id)
            if old != new:
                if old is not None:
                    went.add(old)
                if new is not None:
                    came.add(new)
        return await self._take(conn, came, went)

    async def _take(self, conn: AsyncConnection, came: set[State], went: set[State]) -> QueueChange:
        """The change of ``came`` (new jobs, and jobs whose priority or message changed) and ``went``."""
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
        self._again |= missing  # placed or removed between the two reads: the next read sees them as they are then
        fresh.sort(key=lambda r: (r.submitted_at, r.id))
        return QueueChange(fresh, changed, gone)

    def forget(self, job_id: str) -> None:
        """Read ``job_id`` whole again on the next read, should it still wait (its documents could not be
        used: the pass failed it, and the failure may not have been committed)."""
        self.known.pop(job_id, None)
        self._again.add(job_id)

    def prune_due(self) -> int | None:
        """Where to prune the log up to (``prune``) once this reader has read ``PRUNE_AFTER`` changes since it
        last did; None otherwise. SQLite: its own mark (one server reads the log). Postgres: its mark when it
        last pruned, a round behind, so that the other replicas, which read as often, go on from theirs."""
        if self._mark is None or self._read_since_prune < PRUNE_AFTER:
            return None
        upto = self._mark if self._dialect == "sqlite" else self._pruned_at
        self._read_since_prune, self._pruned_at = 0, self._mark
        return upto or None


#: A job's documents, read only when its scheduling facts are missing or of another version (to derive them).
_WITHOUT_FACTS = sa.or_(jobs.c.scheduling_facts.is_(None), sa.not_(jobs.c.scheduling_facts.startswith(PREFIX)))


#: Built once (``store/prebuilt.py`` says why): a pass reads the jobs first seen, after every apply. The jobs are
#: found by their ids, the queue's terms checked on each row (``unindexed``): SQLite's planner, which has no
#: statistics, would read ``ix_jobs_instance_status`` for them, every waiting job, to find a few.
_WHOLE = (
    waiting_columns()
    .add_columns(
        jobs.c.replica_num,
        jobs.c.scheduling_facts,
        sa.case((_WITHOUT_FACTS, jobs.c.job_spec)).label("job_spec"),
        sa.case((_WITHOUT_FACTS, runs.c.run_spec)).label("run_spec"),
        users.c.global_role,
    )
    .join(runs, runs.c.id == jobs.c.run_id)
    .join(users, users.c.id == runs.c.user_id)
    .where(
        jobs.c.id.in_(sa.bindparam("ids", expanding=True)),
        unindexed(jobs.c.status) == "submitted",
        unindexed(jobs.c.instance_id).is_(None),
    )
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
