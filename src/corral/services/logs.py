"""``logs/poll``: a job's output, stored in the database by the jobs worker (any replica can serve it)."""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any

from corral.context import Context
from corral.domain.records import ProjectRec
from corral.domain.times import epoch_seconds
from corral.services.errors import ResourceNotExists, ServiceError
from corral.services.serialize import iso
from corral.store import runs as store

_SOURCES = {0: "stdout", 1: "stderr"}


def _ts(value: Any) -> float | None:
    if value is None:
        return None
    return epoch_seconds(datetime.fromisoformat(str(value).replace("Z", "+00:00")))


def _after(token: Any) -> int | None:
    """The log row a ``next_token`` continues after (dstack's message for a bad one)."""
    if token in (None, ""):
        return None
    text = str(token)
    if not (text.isascii() and text.isdigit() and int(text) < 2**63):
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise ServiceError(f"Invalid next_token: {shown}. Must be a non-negative integer.")
    return int(text)


async def poll(ctx: Context, project: ProjectRec, body: dict[str, Any]) -> dict[str, Any]:
    async with ctx.db.read() as conn:
        run = await store.get_run(conn, project.id, run_name=body["run_name"])
        if run is None:
            raise ResourceNotExists("Run not found")
        job_id = str(body["job_submission_id"])
        if not any(j.id == job_id for j in run.jobs):
            raise ResourceNotExists("Job submission not found")
        if body.get("diagnose"):
            return {"logs": [], "external_url": None, "next_token": None}
        token = body.get("next_token")
        after = _after(token)
        limit = int(body.get("limit") or 100)
        rows = await store.read_logs(
            conn,
            job_id,
            after,
            limit,
            descending=bool(body.get("descending")),
            start_time=_ts(body.get("start_time")),
            end_time=_ts(body.get("end_time")),
        )
    logs = [
        {
            "timestamp": iso(r.timestamp),
            "log_source": _SOURCES.get(r.source, "stdout"),
            "message": base64.b64encode(r.message).decode(),
        }
        for r in rows
    ]
    return {
        "logs": logs,
        "external_url": None,
        "next_token": str(rows[-1].id) if len(rows) == limit else None,
        "corral_cursor": str(rows[-1].id) if rows else token,
    }
