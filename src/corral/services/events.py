"""``events/list``: the events a reader may see, filtered and paged as dstack 0.22.5 does.

Global admins see every event; anyone else sees an event when one of its targets is in a project they
are a member of, or is their own user (one visible target makes the whole event visible, as in dstack).
Imports ``domain``, ``schemas``, ``store``.
"""

from __future__ import annotations

from datetime import timezone
from typing import Any

from corral.domain.access import reads_all_events
from corral.domain.records import UserRec
from corral.schemas.requests import ListEventsBody
from corral.services.serialize import iso
from corral.store import event_list as store
from corral.store import project_state
from corral.store.db import Database


async def list_events(db: Database, user: UserRec, body: ListEventsBody) -> list[dict[str, Any]]:
    within, target = body.within(), body.target()
    if within is not None and within[0] == "gateway":
        # a gateway's events are its own (corral's gateway has one host, whose events are the instance's)
        target, within = ("gateway", within[1]), None
    prev = body.prev_recorded_at
    if prev is not None and prev.tzinfo is None:
        prev = prev.replace(tzinfo=timezone.utc)  # dstack's client sends UTC
    async with db.read() as conn:
        visible = None if reads_all_events(user.global_role) else await project_state.member_project_ids(conn, user.id)
        found = await store.list_events(
            conn,
            store.EventQuery(
                visible_projects=visible,
                viewer_id=user.id,
                target=target,
                within=within,
                include_types=list(body.include_target_types) if body.include_target_types else None,
                actors=[str(a) if a is not None else None for a in body.actors] if body.actors is not None else None,
                prev_recorded_at=prev.timestamp() if prev is not None else None,
                prev_id=str(body.prev_id) if body.prev_id else None,
                limit=body.limit,
                ascending=body.ascending,
            ),
        )
    return [event(e) for e in found]


def event(e: store.EventRec) -> dict[str, Any]:
    """dstack's ``Event``."""
    return {
        "id": e.id,
        "message": e.message,
        "recorded_at": iso(e.recorded_at),
        "actor_user_id": e.actor_user_id,
        "actor_user": e.actor_user,
        "is_actor_user_deleted": e.is_actor_user_deleted,
        "targets": [
            {
                "type": t.type,
                "project_id": t.project_id,
                "project_name": t.project_name,
                "is_project_deleted": t.is_project_deleted,
                "id": t.id,
                "name": t.name,
            }
            for t in e.targets
        ],
    }
