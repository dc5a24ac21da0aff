"""Live data for the pages, as server-sent events: the runs' statuses (the list and a run's page) and a
job's log tail, plus the log history a page scrolls back through.

Log lines are pushed from the log store: one follower per job, however many pages watch it, reads what
the jobs worker appended when that worker says it appended something (the ``logs`` wake-up) and fans it
out to the pages (a follower also looks every second, for output stored by another server replica). Run
statuses are read again when runs or jobs change (their workers' wake-ups), at most every half second and
at least every two seconds per page.
Each stream ends after ``STREAM_S`` (the browser reconnects at once, resuming from ``Last-Event-ID``), so
that no stream holds up the server's shutdown for long and a session that ended stops being served.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from corral.api.deps import ctx_of
from corral.context import Context, WakeUp
from corral.services import logs
from corral.services.errors import ResourceNotExists
from corral.ui import auth
from corral.ui.pages_runs import find_run, run_row, visible_runs
from corral.ui.render import dollars, environment

log = logging.getLogger("corral.ui")
STREAM_S = 20.0
TAIL_LINES = 200
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")


def _event(name: str, data: Any, event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {name}\ndata: {orjson.dumps(data).decode()}\n\n".encode()


def _sse(body: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(
        body,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


class _Signal:
    """A process-wide 'something changed' that many waiters can wait on (set by a wake-up listener)."""

    def __init__(self) -> None:
        self._waiters: set[asyncio.Event] = set()

    def fire(self) -> None:
        for e in self._waiters:
            e.set()

    async def wait(self, timeout: float) -> None:
        e = asyncio.Event()
        self._waiters.add(e)
        try:
            await asyncio.wait_for(e.wait(), timeout)
        except TimeoutError:
            pass
        finally:
            self._waiters.discard(e)


class LiveFeeds:
    """What the pages' live streams share in one server (the UI holds one): a signal per set of wake-ups,
    and one log follower per job however many pages show it."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._signals: dict[tuple[WakeUp, ...], _Signal] = {}
        #: Job id -> the follower of its log tail.
        self.followers: dict[str, _Follower] = {}

    def signal(self, *names: WakeUp) -> _Signal:
        """The signal fired by any of the wake-ups ``names`` of this server (listened to once per server)."""
        if names not in self._signals:
            self._signals[names] = _Signal()
            for name in names:
                self.ctx.wakeups.listen(name, self._signals[names].fire)
        return self._signals[names]

    def follow(self, project: Any, run_name: str, job_id: str) -> tuple[_Follower, asyncio.Queue[Any]]:
        """A new page's queue of the job's new lines, from the job's follower (started if none runs)."""
        f = self.followers.get(job_id)
        if f is None or f.task is None or f.task.done():
            f = _Follower(self.ctx, project, run_name, job_id, self.followers)
            self.followers[job_id] = f
        q: asyncio.Queue[Any] = asyncio.Queue()
        f.queues.add(q)
        if f.task is None:
            f.task = asyncio.create_task(f.run(self.signal("logs")))
        return f, q

    async def runs_stream(self, request: Request) -> Response:
        return await runs_stream(request, self)

    async def logs_stream(self, request: Request) -> Response:
        return await logs_stream(request, self)


# --- run statuses ---------------------------------------------------------------------------------------


def _state(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": r["id"],
        "status": r["status"],
        "status_message": r.get("status_message") or r["status"],
        "cost": dollars(r.get("cost")),  # a running run's grows: sent again as its shown value changes
        "backend": run_row(r)["backend"] or "—",  # known once its job got an instance
        "jobs": {
            sub["id"]: [sub["status"], sub.get("status_message") or sub["status"]]
            for j in r.get("jobs") or []
            for sub in (j.get("job_submissions") or [])[-1:]
        },
    }


async def runs_stream(request: Request, feeds: LiveFeeds) -> Response:
    """``event: run`` for every run whose status changed (``event: new`` with the row's HTML for a run
    that appeared), for the list's filters (``project``, ``status``, ``user``) or one run (``run``)."""
    s = await auth.require(request)
    q = request.query_params
    project, status, username, only = (
        q.get("project") or None,
        q.get("status") or None,
        q.get("user") or None,
        q.get("run"),
    )
    known: dict[str, Any] = {}
    for ref in q.get("ids", "").split(",")[:200]:
        if ref:
            known[ref] = None  # on the page already: sent once with its current state
    changed = feeds.signal("runs", "scheduler", "jobs")
    row_macro = environment().get_template("rows.html").module.run_row  # type: ignore[attr-defined]

    async def body() -> AsyncIterator[bytes]:
        yield b"retry: 1000\n\n"
        ends = time.monotonic() + STREAM_S
        while time.monotonic() < ends:
            found = await visible_runs(request, s.user, project, status, username)
            for r in found:
                if only and r["id"] != only:
                    continue
                state = _state(r)
                if r["id"] not in known and not only:
                    html = str(row_macro(run_row(r)))
                    yield _event("new", {"id": r["id"], "html": html})
                elif known.get(r["id"]) != state:
                    yield _event("run", state)
                known[r["id"]] = state
            await changed.wait(max(0.0, min(2.0, ends - time.monotonic())))
            await asyncio.sleep(0.5)  # at most two reads a second per page, however busy the server is

    return _sse(body())


# --- logs -----------------------------------------------------------------------------------------------


def _lines(answer: dict[str, Any]) -> list[list[Any]]:
    out = []
    for e in answer["logs"]:
        text = base64.b64decode(e["message"]).decode("utf-8", "replace")
        out.append([e["timestamp"], e["log_source"], _ANSI.sub("", text)])
    return out


class _Follower:
    """One job's log tail, shared by every page that shows it."""

    def __init__(self, ctx: Context, project: Any, run_name: str, job_id: str, followers: dict[str, _Follower]) -> None:
        self.ctx, self.project, self.run_name, self.job_id = ctx, project, run_name, job_id
        #: Every follower of this server's pages, by job id (this one leaves it when it ends).
        self.followers = followers
        self.cursor: str | None = None
        self.queues: set[asyncio.Queue[tuple[int, int, list[list[Any]]]]] = set()
        self.task: asyncio.Task[None] | None = None

    async def run(self, stored: _Signal) -> None:
        try:
            latest = await logs.read(
                self.ctx, self.project, logs.LogQuery(self.run_name, self.job_id, descending=True, limit=1)
            )
            self.cursor = latest["corral_cursor"] if latest["logs"] else None
            while self.queues:
                answer = await logs.read(
                    self.ctx, self.project, logs.LogQuery(self.run_name, self.job_id, next_token=self.cursor, limit=500)
                )
                if answer["logs"]:
                    before, self.cursor = self.cursor, answer["corral_cursor"]
                    batch = (int(before or 0), int(self.cursor), _lines(answer))
                    for q in self.queues:
                        q.put_nowait(batch)
                    continue
                await stored.wait(1.0)
        except ResourceNotExists:
            pass  # the run or the job is gone: nothing more to follow
        except Exception:
            log.exception("following the log of job %s failed", self.job_id)
        finally:
            if self.followers.get(self.job_id) is self:
                del self.followers[self.job_id]


async def _log_target(request: Request) -> tuple[Any, str, str]:
    s = await auth.require(request)
    q = request.query_params
    project, run = await find_run(request, s.user, q.get("project", ""), q.get("run", ""))
    job_id = q.get("job", "")
    return project, run["run_spec"]["run_name"], job_id


async def logs_stream(request: Request, feeds: LiveFeeds) -> Response:
    """The job's last lines (``event: lines``, ``id:`` the log cursor), then every new line as it is stored.
    A reconnect (``Last-Event-ID``) resumes after what was sent. New lines come from the job's one shared
    follower; a page reads the store itself only for what it lacks when it joins."""
    project, run_name, job_id = await _log_target(request)
    ctx = ctx_of(request)
    resume = request.headers.get("last-event-id") or ""
    # the job exists in the run (404 otherwise) before the stream starts
    await logs.read(ctx, project, logs.LogQuery(run_name, job_id, descending=True, limit=1))

    async def body() -> AsyncIterator[bytes]:
        yield b"retry: 1000\n\n"
        follower, queue = feeds.follow(project, run_name, job_id)
        try:
            if resume.isdigit():
                sent = int(resume)
            else:
                newest = await logs.read(
                    ctx, project, logs.LogQuery(run_name, job_id, descending=True, limit=TAIL_LINES)
                )
                older = newest["next_token"]
                yield _event("older", {"before": older})
                sent = int(older) - 1 if older else 0
            catch_up = True
            ends = time.monotonic() + STREAM_S
            while True:
                if catch_up:
                    # what this page lacks (joining, after a reconnect, or a batch it missed): read once
                    catch_up = False
                    answer = await logs.read(
                        ctx,
                        project,
                        logs.LogQuery(run_name, job_id, next_token=str(sent) if sent else None, limit=1000),
                    )
                    if answer["logs"]:
                        sent = int(answer["corral_cursor"])
                        yield _event("lines", _lines(answer), str(sent))
                left = ends - time.monotonic()
                if left <= 0:
                    break
                try:
                    before, cursor, lines = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    break
                if before == sent:
                    sent = cursor
                    yield _event("lines", lines, str(cursor))
                elif cursor > sent:
                    catch_up = True
        finally:
            follower.queues.discard(queue)

    return _sse(body())


async def logs_older(request: Request) -> Response:
    """Up to ``TAIL_LINES`` lines before ``before`` (oldest first), and the cursor to go further back."""
    project, run_name, job_id = await _log_target(request)
    before = request.query_params.get("before") or ""
    if not before.isdigit():
        return JSONResponse({"lines": [], "before": None})
    answer = await logs.read(
        ctx_of(request), project, logs.LogQuery(run_name, job_id, descending=True, next_token=before, limit=TAIL_LINES)
    )
    return JSONResponse({"lines": list(reversed(_lines(answer))), "before": answer["next_token"]})
