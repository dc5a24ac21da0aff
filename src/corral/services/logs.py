"""``logs/poll``: a job's output, stored in the database by the jobs worker (any replica can serve it)."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral.context import Context
from corral.domain.records import ProjectRec
from corral.domain.times import epoch_seconds
from corral.services.errors import ResourceNotExists, ServiceError
from corral.services.serialize import iso
from corral.store import runs as store

if TYPE_CHECKING:
    from corral.schemas.requests import PollLogsBody

_SOURCES = {0: "stdout", 1: "stderr"}


def _after(token: Any) -> int | None:
    """The log row a ``next_token`` continues after (dstack's message for a bad one)."""
    if token in (None, ""):
        return None
    text = str(token)
    if not (text.isascii() and text.isdigit() and int(text) < 2**63):
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise ServiceError(f"Invalid next_token: {shown}. Must be a non-negative integer.")
    return int(text)


@dataclass(frozen=True)
class LogQuery:
    """What a read of a job's log asks for (``logs/poll``'s body, or a page of the web UI)."""

    run_name: str
    #: The job submission's id.
    job_id: str
    descending: bool = False
    #: The log row to continue after (a ``next_token``; checked as dstack checks it).
    next_token: str | None = None
    limit: int = 100
    #: The window, in seconds since the epoch.
    start_time: float | None = None
    end_time: float | None = None
    #: dstack's diagnostic logs (its runner's log): here the agent's own lines about the job (its sandbox,
    #: mounts, image, process, signals and exit), shown as ``stdout`` as dstack shows its runner's.
    diagnose: bool = False


async def poll(ctx: Context, project: ProjectRec, body: PollLogsBody) -> dict[str, Any]:
    """``logs/poll``."""
    query = LogQuery(
        run_name=body.run_name,
        job_id=str(body.job_submission_id),
        descending=body.descending,
        next_token=body.next_token,
        limit=body.limit,
        start_time=None if body.start_time is None else epoch_seconds(body.start_time),
        end_time=None if body.end_time is None else epoch_seconds(body.end_time),
        diagnose=body.diagnose,
    )
    return await read(ctx, project, query)


async def read(ctx: Context, project: ProjectRec, query: LogQuery) -> dict[str, Any]:
    """A page of the job's log, as ``logs/poll`` answers it (plus ``corral_cursor``: the last row's id)."""
    async with ctx.db.read() as conn:
        run = await store.get_run(conn, project.id, run_name=query.run_name)
        if run is None:
            raise ResourceNotExists("Run not found")
        job_id = query.job_id
        if not any(j.id == job_id for j in run.jobs):
            raise ResourceNotExists("Job submission not found")
        token = query.next_token
        after = _after(token)
        limit = query.limit or 100
        rows = await store.read_logs(
            conn,
            job_id,
            after,
            limit,
            descending=query.descending,
            start_time=query.start_time,
            end_time=query.end_time,
            diagnose=query.diagnose,
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
