"""The kept run counts ``GET /metrics`` serves: how many runs each user of each project has in each status
(``run_counts``), and how many times the runs of each project and configuration type were retried whole
(``run_pending_counts``, dstack's ``dstack_pending_runs_total``).

Each count changes in the transaction that changes what it counts: a run inserted (``store/runs.py``), a run's
status changed at the choke point (``store/events.py``'s tracked updates), a run retried whole (the runs
worker). The additions are deferred to the transaction's end and summed (``store/deferred.py``), so that a
transaction writes each count row once, just before it commits, and transactions lock shared rows in one order.
A deleted run is still counted, as dstack counts it (its runs are marked deleted, never removed). A scrape
reads these rows only: its cost follows the number of projects, users and statuses, not of runs ever submitted.

Imports sqlalchemy only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store import deferred, direct
from corral.store.tables import projects, run_counts, run_pending_counts, runs, users


def _upsert(table: sa.Table, keys: tuple[str, ...], marks: Sequence[str]) -> str:
    """The "add to the count" statement of ``table``, one for every dialect (SQLite and Postgres spell
    ``INSERT ... ON CONFLICT ... DO UPDATE`` alike), built once from the table's definition, its parameters
    ``marks``. A text statement, not the dialects' ``insert().on_conflict_do_update()``: SQLAlchemy (2.0.58)
    gives those no cache key, so each execution compiled the statement anew, about half the CPU of a
    transaction changing one run's status."""
    columns = ", ".join(table.c[name].name for name in (*keys, "count"))  # a name the table lacks: KeyError
    return (
        f"INSERT INTO {table.name} ({columns}) VALUES ({', '.join(marks)}) "
        f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET count = {table.name}.count + excluded.count"
    )


def _adder(table: sa.Table, keys: tuple[str, ...]) -> deferred.Counter:
    named = sa.text(_upsert(table, keys, [f":{name}" for name in (*keys, "count")]))
    # on SQLite by the driver itself (plain values: SQLAlchemy's execution path cost more than the statement)
    qmark = _upsert(table, keys, ["?"] * (len(keys) + 1))

    async def write(conn: AsyncConnection, changes: Sequence[tuple[tuple[str, ...], int]]) -> None:
        if conn.dialect.name == "sqlite":
            await deferred.driver_executemany(conn, qmark, [(*key, delta) for key, delta in changes])
            return
        rows = [{**dict(zip(keys, key, strict=True)), "count": delta} for key, delta in changes]
        await conn.execute(named, rows if len(rows) > 1 else rows[0])

    return deferred.Counter(table.name, write)


_STATUS = _adder(run_counts, ("project_id", "user_id", "status"))
_PENDING = _adder(run_pending_counts, ("project_id", "run_type"))


async def runs_inserted(conn: AsyncConnection, rows: Iterable[tuple[str, str, str]]) -> None:
    """Count runs just inserted, each as (project id, user id, status)."""
    for project_id, user_id, status in rows:
        await deferred.count(conn, _STATUS, (project_id, user_id, status), 1)


async def status_changed(conn: AsyncConnection, project_id: str, user_id: str, old: str, new: str) -> None:
    """Move a run of ``user_id`` in ``project_id`` from the count of ``old`` to that of ``new``."""
    if old == new:
        return
    await deferred.count(conn, _STATUS, (project_id, user_id, old), -1)
    await deferred.count(conn, _STATUS, (project_id, user_id, new), 1)


async def retried_whole(conn: AsyncConnection, run_id: str) -> None:
    """Count a retry of the whole run ``run_id`` (none of its replicas was left running): dstack's run going
    back to ``pending``, by the run's project and configuration type."""
    row = (await conn.execute(sa.select(runs.c.project_id, runs.c.run_spec).where(runs.c.id == run_id))).first()
    if row is None:
        return
    await deferred.count(conn, _PENDING, (row.project_id, run_type(row.run_spec)), 1)


def run_type(run_spec: str | None) -> str:
    """The configuration type of a stored run spec ("" where it has none)."""
    try:
        doc = orjson.loads(run_spec or "{}")
    except orjson.JSONDecodeError:
        return ""
    conf = doc.get("configuration") if isinstance(doc, dict) else None
    kind = conf.get("type") if isinstance(conf, dict) else None
    return kind if isinstance(kind, str) else ""


async def recount(conn: AsyncConnection) -> None:
    """Set the status counts to a count of the runs (one ``GROUP BY`` over all of them: for runs written
    around the store, as a benchmark's bulk load; migration 0032 does the same once)."""
    await conn.execute(sa.delete(run_counts))
    counted = sa.select(runs.c.project_id, runs.c.user_id, runs.c.status, sa.func.count()).group_by(
        runs.c.project_id, runs.c.user_id, runs.c.status
    )
    await conn.execute(sa.insert(run_counts).from_select(["project_id", "user_id", "status", "count"], counted))


async def by_status(conn: AsyncConnection) -> dict[tuple[str, str], dict[str, int]]:
    """(project name, user name) -> {status: runs}, from the kept counts (one row per project, user and
    status ever used)."""
    q = (
        sa.select(projects.c.name, users.c.name, run_counts.c.status, run_counts.c.count)
        .select_from(run_counts)
        .join(projects, projects.c.id == run_counts.c.project_id)
        .join(users, users.c.id == run_counts.c.user_id)
        .where(run_counts.c.count != 0)
    )
    out: dict[tuple[str, str], dict[str, int]] = {}
    for project, user, status, n in await conn.execute(q):
        statuses = out.setdefault((project, user), {})
        statuses[status] = statuses.get(status, 0) + int(n)
    return dict(sorted(out.items()))


#: One row per project and user: every run, then the terminated, failed and done ones. SQLite sums them in C, so a
#: scrape reads a row per series' labels rather than one per status (``GET /metrics`` serves one series per user and
#: status for every user who ever ran: thousands a year in).
_SERIES = (
    sa.select(
        projects.c.name,
        users.c.name,
        sa.func.sum(run_counts.c.count),
        *(
            sa.func.sum(sa.case((run_counts.c.status == status, run_counts.c.count), else_=0))
            for status in ("terminated", "failed", "done")
        ),
    )
    .select_from(run_counts)
    .join(projects, projects.c.id == run_counts.c.project_id)
    .join(users, users.c.id == run_counts.c.user_id)
    .where(run_counts.c.count != 0)
    .group_by(projects.c.name, users.c.name)
    .order_by(projects.c.name, users.c.name)
)


async def series(conn: AsyncConnection) -> list[tuple[str, str, int, int, int, int]]:
    """(project name, user name, runs, terminated, failed, done) for each project and user with a run counted,
    ordered by the names (as Python orders them: Postgres' collation may not), read as plain tuples (on SQLite by
    its driver, ``store/direct.py``)."""
    return sorted(tuple(r) for r in await direct.execute(conn, _SERIES))


_PENDING_SERIES = (
    sa.select(projects.c.name, run_pending_counts.c.run_type, run_pending_counts.c.count)
    .select_from(run_pending_counts)
    .join(projects, projects.c.id == run_pending_counts.c.project_id)
    .where(run_pending_counts.c.count != 0)
    .order_by(projects.c.name, run_pending_counts.c.run_type)
)


async def pending(conn: AsyncConnection) -> dict[tuple[str, str], int]:
    """(project name, run type) -> retries of whole runs, from the kept counts."""
    return {(r[0], r[1]): int(r[2]) for r in await direct.execute(conn, _PENDING_SERIES)}
