"""The event recorder and reader (dstack's events).

``emit`` adds an event to the transaction the caller has open -- the one that makes the change the event
describes -- so an event is committed exactly when its change is, by whichever replica made it, and none
is left by a change that rolled back. ``tracked_update`` is the UPDATE of a job, instance, run or fleet
that records its status changes (and an instance's reachability) as it makes them -- and the choke point of
those changes: each is checked against the transition tables first (``store/transitions.py``), and a row whose
change is illegal is not written. A run's status change moves the run between the kept counts
(``store/run_counts.py``) in the same transaction.

Storage follows the database's ``events_ttl`` (``Database``): at most zero stores nothing; older events go
in batches (``delete_expired``). Reading them is ``store/event_list.py``.

The choke point's statements of one row by its id are built once (``store/prebuilt.py``) and, on SQLite, run by
its driver itself (``store/direct.py``); Postgres runs them through SQLAlchemy.

Imports ``domain``, the store's ``deferred``, ``direct``, ``prebuilt``, ``run_counts`` and ``transitions``, and
sqlalchemy.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.events import (
    Target,
    clean_message,
    fleet_target,
    instance_target,
    job_target,
    run_target,
    status_change_message,
)
from corral.store import deferred, direct, prebuilt, run_counts, transitions
from corral.store.db import EVENTS_TTL_OPTION
from corral.store.tables import event_targets, events, instances, runs

log = logging.getLogger("corral.events")

#: dstack's default (``DSTACK_SERVER_EVENTS_TTL_SECONDS``): 30 days.
DEFAULT_TTL = 30 * 24 * 3600.0

_last_at = 0.0


def _clock() -> float:
    """Now, to the microsecond (the wire's resolution), and later than any event this process recorded
    before: events of one transaction keep the order they were emitted in."""
    global _last_at
    at = max(round(time.time(), 6), round(_last_at + 1e-6, 6))
    _last_at = at
    return at


def ttl_of(conn: AsyncConnection) -> float:
    options = conn.sync_connection.get_execution_options() if conn.sync_connection is not None else {}
    return float(options.get(EVENTS_TTL_OPTION, DEFAULT_TTL))


_INSERT_EVENT = sa.insert(events)
_INSERT_TARGETS = sa.insert(event_targets)


async def emit(conn: AsyncConnection, message: str, actor_id: str | None, targets: Sequence[Target]) -> None:
    """Record an event in ``conn``'s open transaction. ``actor_id`` is the user who acted (None: the system)."""
    if not targets:
        raise ValueError("an event needs at least one target")
    text = clean_message(message)
    if log.isEnabledFor(logging.DEBUG):  # the targets' names are joined only for a log that shows them
        log.debug(
            "event: %s [%s] by %s",
            text,
            ", ".join(f"{t.type} {t.name}" for t in targets),
            actor_id or "system",
            extra={"event": "event_recorded"},
        )
    if ttl_of(conn) <= 0:
        return
    event_id, at = str(uuid.uuid4()), _clock()
    # written with the transaction's other events just before it commits (``store/deferred.py``)
    await deferred.insert(
        conn, _INSERT_EVENT, [{"id": event_id, "message": text, "recorded_at": at, "actor_user_id": actor_id}]
    )
    await deferred.insert(
        conn,
        _INSERT_TARGETS,
        [
            {
                "event_id": event_id,
                "recorded_at": at,
                "entity_type": t.type,
                "entity_project_id": t.project_id,
                "entity_id": t.id,
                "entity_name": t.name,
                "entity_run_id": t.run_id,
                "entity_fleet_id": t.fleet_id,
            }
            for t in targets
        ],
    )


# --- status changes ---------------------------------------------------------------------------------------

_TRACKED: dict[str, tuple[str, ...]] = {
    "jobs": ("project_id", "job_name", "run_id", "termination_reason", "termination_reason_message"),
    "instances": ("project_id", "name", "fleet_id", "termination_reason", "termination_reason_message", "unreachable"),
    "runs": ("project_id", "run_name", "termination_reason", "user_id"),
    "fleets": ("project_id", "name", "status_message"),
}
_KIND = {"jobs": "job", "instances": "instance", "runs": "run", "fleets": "fleet"}


def _target(table: str, row: Any) -> Target:
    if table == "jobs":
        return job_target(row.project_id, row.id, row.job_name, row.run_id)
    if table == "instances":
        return instance_target(row.project_id, row.id, row.name, row.fleet_id)
    if table == "runs":
        return run_target(row.project_id, row.id, row.run_name)
    return fleet_target(row.project_id, row.id, row.name)


def _messages(table: str, row: Any, values: Mapping[str, Any]) -> list[str]:
    out = []
    new = values.get("status")
    if new is not None and new != row.status:
        reason = values.get("termination_reason", getattr(row, "termination_reason", None))
        detail_col = "status_message" if table == "fleets" else "termination_reason_message"
        detail = values.get(detail_col, getattr(row, detail_col, None))
        out.append(status_change_message(_KIND[table], row.status, new, reason, detail))
    if table == "instances" and "unreachable" in values and bool(values["unreachable"]) != bool(row.unreachable):
        out.append("Instance became unreachable" if values["unreachable"] else "Instance became reachable")
    return out


def _watched(table: sa.Table, values: Mapping[str, Any]) -> bool:
    """Whether changing ``values`` of ``table`` may record an event (a status, an instance's reachability)."""
    return "status" in values or (table is instances and "unreachable" in values)


def _counted(table: sa.Table, values: Mapping[str, Any]) -> bool:
    """Whether changing ``values`` of ``table`` moves rows between kept counts (a run's status)."""
    return table is runs and "status" in values


async def _recount(conn: AsyncConnection, table: sa.Table, row: Any, values: Mapping[str, Any]) -> None:
    """Move the row updated (``row``: as it was) to the count of its new status, where one is kept."""
    if _counted(table, values):
        await run_counts.status_changed(conn, row.project_id, row.user_id, row.status, values["status"])


async def tracked_update(
    conn: AsyncConnection,
    table: sa.Table,
    where: sa.ColumnElement[bool],
    values: Mapping[str, Any],
    actor_id: str | None = None,
) -> int:
    """``UPDATE table SET values WHERE where``, recording each row's status change (and an instance's
    reachability) as an event of the same transaction; returns how many rows were updated (a row whose status
    change is illegal is not: ``store/transitions.py``)."""
    if not transitions.checked(table.name, values) and (not _watched(table, values) or ttl_of(conn) <= 0):
        return int((await conn.execute(sa.update(table).where(where).values(**values))).rowcount)
    return len(await tracked_update_rows(conn, table, where, values, actor_id))


async def tracked_update_by_id(
    conn: AsyncConnection,
    table: sa.Table,
    row_id: str,
    values: Mapping[str, Any],
    expect_status: Sequence[str] | None = None,
    actor_id: str | None = None,
) -> bool:
    """:func:`tracked_update` of the row ``row_id`` (while its status is one of ``expect_status``, if given) with
    statements built once (``store/prebuilt.py``, on SQLite run by its driver: ``store/direct.py``): ``values`` are
    plain values, bound as parameters; whether it was updated. A status change needs no read of the row where
    every status expected may go to the new one."""
    checked = transitions.checked(table.name, values)
    if checked and not transitions.expected_allowed(table.name, expect_status, values["status"]):
        return await tracked_update_row(conn, table, row_id, values, expect_status, actor_id) is not None
    if not _counted(table, values) and (not _watched(table, values) or ttl_of(conn) <= 0):
        update = prebuilt.update_by_id(table, frozenset(values), prebuilt.expecting(expect_status))
        return int((await direct.execute(conn, update, prebuilt.params(row_id, values, expect_status))).rowcount) > 0
    return await tracked_update_row(conn, table, row_id, values, expect_status, actor_id) is not None


async def tracked_update_row(
    conn: AsyncConnection,
    table: sa.Table,
    row_id: str,
    values: Mapping[str, Any],
    expect_status: Sequence[str] | None = None,
    actor_id: str | None = None,
) -> Any:
    """:func:`tracked_update_by_id` that records the change as an event whatever ``values`` are, and returns the row
    as it was (its id, status and what names it), or None if it was not updated.

    A row that must be in one status is updated and named by one statement (``UPDATE ... RETURNING``, where the
    database has it): its status was that one. A termination reason or message ``values`` set is then given back
    as set (the event's message takes them from ``values`` either way). A status change the transition tables do
    not allow from the status the row is in is refused (``store/transitions.py``): the row is not written, and
    None is returned."""
    cols = ("id", "status", *_TRACKED[table.name])
    checked = transitions.checked(table.name, values)
    if (
        expect_status is not None
        and len(expect_status) == 1
        and (not checked or transitions.expected_allowed(table.name, expect_status, values["status"]))
        and conn.dialect.update_returning
        and _IDENTITY[table.name].isdisjoint(values)
    ):
        returning = prebuilt.update_returning(table, frozenset(values), cols[2:])
        got = (await direct.execute(conn, returning, prebuilt.params(row_id, values, expect_status))).first()
        if got is None:
            return None
        row = _Was(row_id, expect_status[0], got)
    else:
        row = await _select_then_update(conn, table, cols, row_id, values, expect_status)
        if row is None:
            return None
    await _recount(conn, table, row, values)
    for message in _messages(table.name, row, values):
        await emit(conn, message, actor_id, [_target(table.name, row)])
    return row


class _Was:
    """A row as it was before an ``UPDATE ... RETURNING``: its id, the status it had to be in, and the returned
    columns (by name)."""

    def __init__(self, row_id: str, status: str, returned: Any) -> None:
        self.id, self.status = row_id, status
        self.__dict__.update(returned._mapping)


#: The columns an event reads from the row as it was, never from the new values: they name the row (and an
#: instance's reachability is compared with its new one). An update that sets one of them reads the row first.
_IDENTITY: dict[str, frozenset[str]] = {
    name: frozenset(cols) - {"termination_reason", "termination_reason_message", "status_message"}
    for name, cols in _TRACKED.items()
}


async def _select_then_update(
    conn: AsyncConnection,
    table: sa.Table,
    cols: tuple[str, ...],
    row_id: str,
    values: Mapping[str, Any],
    expect_status: Sequence[str] | None,
) -> Any:
    """The row as it was (locked on Postgres), then updated; None if it is not (or not in ``expect_status``, or
    its status change is refused)."""
    select = prebuilt.select_by_id(table, cols, prebuilt.expecting(expect_status), lock=conn.dialect.name != "sqlite")
    row = (await direct.execute(conn, select, prebuilt.params(row_id, {}, expect_status))).first()
    if row is None:
        return None
    if transitions.checked(table.name, values) and not transitions.permit(
        table.name, row_id, row.status, values["status"]
    ):
        return None
    await direct.execute(conn, prebuilt.update_by_id(table, frozenset(values), None), prebuilt.params(row_id, values))
    return row


async def tracked_update_rows(
    conn: AsyncConnection,
    table: sa.Table,
    where: sa.ColumnElement[bool],
    values: Mapping[str, Any],
    actor_id: str | None = None,
) -> list[Any]:
    """:func:`tracked_update` that returns the rows it updated as they were before (their id, status and
    what names them). The rows are read first -- locked on Postgres; SQLite's write transaction already
    excludes other writers -- so the old status is exact and the UPDATE touches exactly them. A row whose status
    change is illegal is left out (``store/transitions.py``): neither written nor returned."""
    cols = [table.c.id, table.c.status, *(table.c[c] for c in _TRACKED[table.name])]
    q = sa.select(*cols).where(where)
    if conn.dialect.name != "sqlite":
        q = q.with_for_update(of=table)
    rows = list((await conn.execute(q)).all())
    if rows and transitions.checked(table.name, values):
        # every row checked before any is written: under STRICT a refusal raises with nothing written
        new = values["status"]
        rows = [r for r in rows if transitions.permit(table.name, r.id, r.status, new)]
    if not rows:
        return []
    await conn.execute(sa.update(table).where(table.c.id.in_([r.id for r in rows])).values(**values))
    for row in rows:
        await _recount(conn, table, row, values)
        for message in _messages(table.name, row, values):
            await emit(conn, message, actor_id, [_target(table.name, row)])
    return rows


#: How many expired events one cleanup deletes at most (one short write transaction).
EXPIRED_BATCH = 5000


async def delete_expired(conn: AsyncConnection, before: float, batch: int = EXPIRED_BATCH) -> int:
    """Delete up to ``batch`` events recorded before ``before`` (and their targets): one indexed range."""
    ids = list(
        (
            await conn.execute(
                sa.select(events.c.id).where(events.c.recorded_at < before).order_by(events.c.recorded_at).limit(batch)
            )
        ).scalars()
    )
    if not ids:
        return 0
    await conn.execute(sa.delete(event_targets).where(event_targets.c.event_id.in_(ids)))
    await conn.execute(sa.delete(events).where(events.c.id.in_(ids)))
    return len(ids)
