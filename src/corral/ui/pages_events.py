"""Events: the global list (``/events``, newest first, paged back) and the events of a run or a fleet on
their pages, read through ``events.list_events`` as ``events/list`` reads them (what the user may see)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from corral.api.deps import ctx_of
from corral.domain.records import UserRec
from corral.schemas.requests import ListEventsBody
from corral.services import events
from corral.services.errors import ServiceError
from corral.ui import auth
from corral.ui.render import page


async def recent(request: Request, user: UserRec, limit: int = 20, **filters: Any) -> list[dict[str, Any]]:
    """The latest events the user may see, narrowed by ``events/list`` filters (``within_runs=[id]``, ...)."""
    try:
        body = ListEventsBody.model_validate({"limit": limit, **filters})
    except ValidationError:
        return []  # an id that no event can name (events name their targets by UUID)
    return await events.list_events(ctx_of(request).db, user, body)


async def events_list(request: Request) -> Response:
    s = await auth.require(request)
    q = request.query_params
    filters: dict[str, Any] = {}
    if q.get("before_at") or q.get("before_id"):
        filters = {"prev_recorded_at": q.get("before_at"), "prev_id": q.get("before_id")}
        try:
            ListEventsBody.model_validate(filters)
        except ValidationError:
            raise ServiceError("before_at and before_id: the time and id of the last event shown") from None
    found = await recent(request, s.user, 100, **filters)
    last = found[-1] if len(found) == 100 else None
    return page(request, "events.html", title="Events", nav="events", events=found, last=last)
