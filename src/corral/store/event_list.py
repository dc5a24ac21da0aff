"""Reading events: dstack's ``events/list`` -- its filters, keyset pages, and who may see what.

An event is listed when one of its targets matches the filter (``target_*``, ``within_*``,
``include_target_types``), one of its targets is visible to the reader (a project they are a member of,
or their own user), its actor is one of ``actors``, and it comes after the page cursor. The order is
dstack's: ``(recorded_at desc, id asc)``, or ``(recorded_at asc, id desc)`` ascending.

How it stays fast however long the history: the candidates come from ordered index ranges of
``event_targets`` -- one range per filtered id (an entity, a project, a run, a fleet), or per visible
project and the reader's own user, each ``(column, recorded_at)`` -- merged in order, a page's worth at a
time; the rest of the conditions are checked on the candidates' own targets. Only when nothing narrows
the events (a global admin's unfiltered list) does the walk go over ``events`` by ``recorded_at``.

Imports ``domain`` and sqlalchemy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store.tables import event_targets, events, projects, users


@dataclass(frozen=True)
class TargetRec:
    type: str
    project_id: str | None
    project_name: str | None
    is_project_deleted: bool | None
    id: str
    name: str


@dataclass(frozen=True)
class EventRec:
    id: str
    message: str
    recorded_at: float
    actor_user_id: str | None
    actor_user: str | None
    is_actor_user_deleted: bool | None
    targets: tuple[TargetRec, ...]


@dataclass(frozen=True)
class EventQuery:
    """One ``events/list`` request, resolved: ``target`` is (type, ids) of the one ``target_*`` filter,
    ``within`` (``project``, ``fleet`` or ``run``, ids) of the one ``within_*``; ``visible_projects`` None
    means everything (a global admin), else the projects the reader may read (and ``viewer_id``'s own user
    events)."""

    visible_projects: Sequence[str] | None
    viewer_id: str | None = None
    target: tuple[str, Sequence[str]] | None = None
    within: tuple[str, Sequence[str]] | None = None
    include_types: Sequence[str] | None = None
    actors: Sequence[str | None] | None = None
    prev_recorded_at: float | None = None
    prev_id: str | None = None
    limit: int = 100
    ascending: bool = False


_WITHIN = {"project": "entity_project_id", "fleet": "entity_fleet_id", "run": "entity_run_id"}
#: A cursor: (recorded_at, id) of the last event of the previous page; id None: strictly after the time.
Cursor = tuple[float, str | None]
#: An event's place in the order: (recorded_at, id).
Place = tuple[float, str]


def _after(at_col: Any, id_col: Any, cursor: Cursor | None, ascending: bool) -> list[sa.ColumnElement[bool]]:
    if cursor is None:
        return []
    at, prev_id = cursor
    if prev_id is None:
        return [at_col > at if ascending else at_col < at]
    if ascending:  # (recorded_at asc, id desc)
        return [sa.or_(at_col > at, sa.and_(at_col == at, id_col < prev_id))]
    return [sa.or_(at_col < at, sa.and_(at_col == at, id_col > prev_id))]


def _order(at_col: Any, id_col: Any, ascending: bool) -> tuple[Any, Any]:
    return (at_col.asc(), id_col.desc()) if ascending else (at_col.desc(), id_col.asc())


def _sort_key(ascending: bool) -> Any:
    """Sorts (recorded_at, id) pairs in page order (ids compared as strings, as the database does)."""
    if ascending:
        return lambda r: (r[0], _Reversed(r[1]))
    return lambda r: (-r[0], r[1])


class _Reversed(str):
    """A string that sorts backwards (ids descending within one ``recorded_at``, ascending pages)."""

    def __lt__(self, other: str) -> bool:
        return str.__gt__(self, other)

    def __le__(self, other: str) -> bool:
        return str.__ge__(self, other)

    def __gt__(self, other: str) -> bool:
        return str.__lt__(self, other)

    def __ge__(self, other: str) -> bool:
        return str.__le__(self, other)


def _ranges(q: EventQuery) -> list[list[sa.ColumnElement[bool]]] | None:
    """The index ranges of ``event_targets`` the candidates come from (None: walk ``events`` itself)."""
    t = event_targets.c
    kinds = [t.entity_type.in_(list(q.include_types))] if q.include_types is not None else []
    if q.target is not None:
        kind, ids = q.target
        return [[t.entity_id == i, t.entity_type == kind, *kinds] for i in ids]
    if q.within is not None:
        kind, ids = q.within
        return [[t[_WITHIN[kind]] == i, *kinds] for i in ids]
    if q.visible_projects is not None:
        own = [[t.entity_id == q.viewer_id, t.entity_type == "user"]] if q.viewer_id else []
        return [[t.entity_project_id == p] for p in q.visible_projects] + own
    return None


def _matches(q: EventQuery, targets: Sequence[Any]) -> bool:
    """The filter and the visibility, checked on an event's targets (rows of ``event_targets``)."""

    def wanted(t: Any) -> bool:
        if q.include_types is not None and t.entity_type not in q.include_types:
            return False
        if q.target is not None and (t.entity_type != q.target[0] or t.entity_id not in q.target[1]):
            return False
        return q.within is None or getattr(t, _WITHIN[q.within[0]]) in q.within[1]

    def visible(t: Any) -> bool:
        if q.visible_projects is None:
            return True
        if t.entity_project_id is None:
            return bool(t.entity_type == "user" and t.entity_id == q.viewer_id)
        return t.entity_project_id in q.visible_projects

    return any(wanted(t) for t in targets) and any(visible(t) for t in targets)


async def _candidates(conn: AsyncConnection, q: EventQuery, cursor: Cursor | None, k: int) -> tuple[list[Place], bool]:
    """The next events (recorded_at, id) in page order after ``cursor``, at most about ``k``, and whether
    there may be more: every range read up to where the one that stopped earliest stopped."""
    ranges = _ranges(q)
    e, t = events.c, event_targets.c
    if ranges is None:
        stmt = sa.select(e.recorded_at, e.id).where(*_after(e.recorded_at, e.id, cursor, q.ascending))
        stmt = stmt.order_by(*_order(e.recorded_at, e.id, q.ascending)).limit(k)
        places = [(r.recorded_at, r.id) for r in await conn.execute(stmt)]
        return places, len(places) == k
    found: set[Place] = set()
    bound: Place | None = None
    key = _sort_key(q.ascending)
    for conds in ranges:
        stmt = (
            sa.select(t.recorded_at, t.event_id)
            .where(*conds, *_after(t.recorded_at, t.event_id, cursor, q.ascending))
            .order_by(*_order(t.recorded_at, t.event_id, q.ascending))
            .limit(k)
        )
        rows = [(r.recorded_at, r.event_id) for r in await conn.execute(stmt)]
        found.update(rows)
        if len(rows) == k and (bound is None or key(rows[-1]) < key(bound)):
            bound = rows[-1]  # this range may go on past here: nothing after it is known complete
    ordered = sorted(found, key=key)
    if bound is not None:
        ordered = [c for c in ordered if key(c) <= key(bound)]
    return ordered, bound is not None


async def list_events(conn: AsyncConnection, q: EventQuery) -> list[EventRec]:
    cursor: Cursor | None = (q.prev_recorded_at, q.prev_id) if q.prev_recorded_at is not None else None
    chosen: list[EventRec] = []
    k = 2 * q.limit + 1  # an event may be in a range twice (two targets in one project): read enough at once
    while len(chosen) < q.limit:
        batch, more = await _candidates(conn, q, cursor, k)
        step = q.limit - len(chosen)
        while batch and len(chosen) < q.limit:
            head, batch = batch[:step], batch[step:]
            chosen += await _checked(conn, q, head, q.limit - len(chosen))
            cursor = head[-1]
            step = min(4 * step, 2000)  # a sparse match: look further ahead each time
        if not more:
            break
        k = min(4 * k, 2000)
    return chosen


async def _checked(conn: AsyncConnection, q: EventQuery, places: list[Place], room: int) -> list[EventRec]:
    """Those of ``places`` that the actors, the filter and the reader's visibility admit (at most ``room``)."""
    stmt = (
        sa.select(events, users.c.name.label("actor_name"), users.c.deleted.label("actor_deleted"))
        .outerjoin(users, users.c.id == events.c.actor_user_id)
        .where(events.c.id.in_([i for _at, i in places]))
    )
    if q.actors is not None:
        named = [a for a in q.actors if a is not None]
        either = [events.c.actor_user_id.in_(named)] if named else []
        if None in q.actors:
            either.append(events.c.actor_user_id.is_(None))
        stmt = stmt.where(sa.or_(*either))
    rows = {r.id: r for r in await conn.execute(stmt)}
    if not rows:
        return []
    by_event: dict[str, list[Any]] = {i: [] for i in rows}
    tq = (
        sa.select(event_targets, projects.c.name.label("project_name"), projects.c.deleted.label("gone"))
        .outerjoin(projects, projects.c.id == event_targets.c.entity_project_id)
        .where(event_targets.c.event_id.in_(list(rows)))
        .order_by(event_targets.c.id)
    )
    for tr in await conn.execute(tq):
        by_event[tr.event_id].append(tr)
    out = [_record(rows[i], by_event[i]) for _at, i in places if i in rows and _matches(q, by_event[i])]
    return out[:room]


def _record(r: Any, targets: Sequence[Any]) -> EventRec:
    return EventRec(
        r.id,
        r.message,
        r.recorded_at,
        r.actor_user_id,
        r.actor_name,
        None if r.actor_user_id is None else bool(r.actor_deleted),
        tuple(
            TargetRec(
                t.entity_type,
                t.entity_project_id,
                t.project_name,
                None if t.entity_project_id is None else bool(t.gone) if t.project_name is not None else True,
                t.entity_id,
                t.entity_name,
            )
            for t in targets
        ),
    )
