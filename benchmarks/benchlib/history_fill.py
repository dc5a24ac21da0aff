"""A year of history written into a corral database through the store's table definitions
(``corral.store.tables``; bulk inserts in large transactions), for ``benchmarks/history_scale.py``.

The documents (a run's spec, its job's spec and scheduling facts, a fleet's spec) are copied from rows the
server itself wrote for a run and a fleet applied through the API (:class:`Template`), with the names changed,
so the rows are what the server writes and reads, not hand-made JSON that could drift from it.

What is written for ``runs`` finished runs (the defaults of the issue):

* 1,000 users and 100 projects (those there already, ``main`` among them, and more; each new user a member of
  one project); the runs spread over the 100 projects and the 1,000 users (``admin`` included), submitted
  evenly over the last 365 days;
* one job per run; every 100th run resubmitted 9 times (10 submissions), every 20th twice more;
* events as real runs write them (8 per run: the run's 4 status changes, its job's 4), for the runs of the
  last 30 days only: dstack's and corral's events retention (``DSTACK_SERVER_EVENTS_TTL_SECONDS``, 30 days)
  deletes older ones, so a server a year old holds no more;
* 500 fleets (5 per project), each with 20 terminated instances and one live (10,000 and 500);
* 200 running runs (their jobs on the first 200 live instances), each job with an hour of metric samples
  (one per 10 s: dstack's agent's collection interval);
* 50 log lines for each of the newest 1,000 finished runs' jobs;
* the run counts of ``GET /metrics`` counted as the store counts them (``run_counts.recount``).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from corral.store import run_counts
from corral.store import tables as t
from corral.store.db import Database

DAY = 86400.0
YEAR = 365 * DAY
EVENTS_WINDOW = 30 * DAY  # dstack's DSTACK_SERVER_EVENTS_TTL_SECONDS default (30 days)
BATCH = 20_000
USERS, PROJECTS, FLEETS, TERMINATED_PER_FLEET = 1000, 100, 500, 20
RUNNING, LOGGED_RUNS, LOG_LINES = 200, 1000, 50
SAMPLES, SAMPLE_EVERY = 360, 10.0


@dataclass(frozen=True)
class Template:
    """Documents the server wrote for one applied run (and its job) and one applied fleet."""

    run_name: str
    run_spec: str
    job_spec: str
    facts: str | None
    fleet_name: str
    fleet_spec: str

    def named(self, text: str, name: str) -> str:
        return text.replace(self.run_name, name)


@dataclass
class Ids:
    admin: str
    users: list[str]
    projects: list[str]
    fleets: list[tuple[str, str]]  # (fleet id, project id)
    live_instances: list[str]


async def template(db: Database, run_name: str, fleet_name: str) -> Template:
    async with db.read() as conn:
        run = (await conn.execute(sa.select(t.runs).where(t.runs.c.run_name == run_name))).one()
        job = (await conn.execute(sa.select(t.jobs).where(t.jobs.c.run_id == run.id))).first()
        fleet = (await conn.execute(sa.select(t.fleets).where(t.fleets.c.name == fleet_name))).one()
    assert job is not None
    return Template(run_name, run.run_spec, job.job_spec, job.scheduling_facts, fleet_name, fleet.spec)


async def _insert(db: Database, table: sa.Table, rows: Iterator[dict[str, Any]]) -> int:
    n, chunk = 0, []
    stmt = sa.insert(table)
    for row in rows:
        chunk.append(row)
        if len(chunk) >= BATCH:
            async with db.write() as conn:
                await conn.execute(stmt, chunk)
            n, chunk = n + len(chunk), []
    if chunk:
        async with db.write() as conn:
            await conn.execute(stmt, chunk)
    return n + len(chunk)


async def _accounts(db: Database, now: float, seal: Callable[[str], str]) -> Ids:
    async with db.read() as conn:
        admin = (await conn.execute(sa.select(t.users.c.id).where(t.users.c.name == "admin"))).scalar_one()
        names = sa.select(t.projects.c.id).where(t.projects.c.deleted == sa.false()).order_by(t.projects.c.name)
        existing = list((await conn.execute(names)).scalars())
    users = [str(uuid.uuid4()) for _ in range(USERS - 1)]
    projects = [str(uuid.uuid4()) for _ in range(PROJECTS - len(existing))]
    await _insert(
        db,
        t.users,
        (
            {"id": u, "name": f"user{k}", "token": seal(f"t{k}"), "token_hash": hashlib.sha256(u.encode()).hexdigest(),
             "global_role": "user", "active": True, "deleted": False, "created_at": now - YEAR}
            for k, u in enumerate(users)
        ),
    )  # fmt: skip
    await _insert(
        db,
        t.projects,
        (
            {"id": p, "name": f"project{k}", "owner_id": admin, "created_at": now - YEAR, "is_public": False,
             "deleted": False, "backends": "[]"}
            for k, p in enumerate(projects)
        ),
    )  # fmt: skip
    all_projects = [*existing, *projects]
    await _insert(
        db,
        t.members,
        ({"project_id": all_projects[k % PROJECTS], "user_id": u, "project_role": "user", "member_num": 0}
         for k, u in enumerate(users)),
    )  # fmt: skip
    return Ids(admin, [admin, *users], all_projects, [], [])


def _fleet_rows(tpl: Template, ids: Ids, now: float) -> Iterator[dict[str, Any]]:
    for k in range(FLEETS):
        fid, pid = str(uuid.uuid4()), ids.projects[k % PROJECTS]
        ids.fleets.append((fid, pid))
        name = f"fleet{k}"
        yield {"id": fid, "project_id": pid, "name": name, "created_at": now - YEAR, "last_processed_at": now,
               "status": "active", "spec": tpl.fleet_spec.replace(tpl.fleet_name, name), "deleted": False}  # fmt: skip


def _instance_rows(ids: Ids, now: float) -> Iterator[dict[str, Any]]:
    for k, (fid, pid) in enumerate(ids.fleets):
        for n in range(TERMINATED_PER_FLEET + 1):
            live = n == TERMINATED_PER_FLEET
            iid = str(uuid.uuid4())
            if live:
                ids.live_instances.append(iid)
            busy = live and len(ids.live_instances) <= RUNNING
            yield {
                "id": iid, "project_id": pid, "fleet_id": fid, "name": f"fleet{k}-{n}", "instance_num": n,
                "status": ("busy" if busy else "idle") if live else "terminated", "unreachable": False,
                "backend": "ssh", "region": "remote", "price": 0.0, "total_blocks": 1, "busy_blocks": int(busy),
                "hostname": f"10.{k // 250}.{k % 250}.{n}", "created_at": now - YEAR + k * 60,
                "started_at": now - YEAR + k * 60, "finished_at": None if live else now - YEAR / 2,
                "termination_reason": None if live else "terminated_by_user", "deleted": not live,
                "last_processed_at": now,
            }  # fmt: skip


_STATUSES = ("done",) * 16 + ("failed",) * 3 + ("terminated",)
_REASON = {"done": "all_jobs_done", "failed": "job_failed", "terminated": "stopped_by_user", "running": None}
_JOB_REASON = {"done": "done_by_runner", "failed": "container_exited_with_error", "terminated": "terminated_by_user"}


@dataclass(frozen=True)
class RunPlan:
    """Where run ``i`` of ``n`` sits: its id, name, owner, time, status and number of submissions."""

    i: int
    id: str
    name: str
    project: str
    user: str
    at: float
    status: str

    @property
    def submissions(self) -> int:
        return 10 if self.i % 100 == 0 else 3 if self.i % 20 == 1 else 1


def plans(ids: Ids, n: int, now: float) -> list[RunPlan]:
    span = YEAR - 2 * 3600
    out = [
        RunPlan(i, str(uuid.uuid4()), f"h{i}", ids.projects[i % PROJECTS], ids.users[i % USERS],
                now - YEAR + span * i / n, _STATUSES[i % len(_STATUSES)])
        for i in range(n)
    ]  # fmt: skip
    out += [
        RunPlan(n + k, str(uuid.uuid4()), f"live{k}", ids.projects[k % PROJECTS], ids.users[k % USERS],
                now - 3600 + k, "running")
        for k in range(RUNNING)
    ]  # fmt: skip
    return out


def _run_rows(tpl: Template, runs: list[RunPlan], now: float) -> Iterator[dict[str, Any]]:
    for r in runs:
        yield {
            "id": r.id, "project_id": r.project, "user_id": r.user, "run_name": r.name, "submitted_at": r.at,
            "last_processed_at": r.at + 600 if r.status != "running" else now, "status": r.status,
            "termination_reason": _REASON[r.status], "run_spec": tpl.named(tpl.run_spec, r.name), "priority": 0,
            "deployment_num": 0, "deleted": False,
        }  # fmt: skip


def _job_rows(tpl: Template, runs: list[RunPlan], ids: Ids) -> Iterator[dict[str, Any]]:
    for r in runs:
        spec = tpl.named(tpl.job_spec, r.name)
        facts = tpl.named(tpl.facts, r.name) if tpl.facts is not None else None
        live = r.status == "running"
        for s in range(r.submissions):
            last = s == r.submissions - 1
            status = r.status if last else "failed"
            yield {
                "id": job_id(r, s), "run_id": r.id, "project_id": r.project, "run_name": r.name, "job_num": 0,
                "replica_num": 0, "job_name": f"{r.name}-0-0", "submission_num": s, "deployment_num": 0,
                "submitted_at": r.at + s * 60, "last_processed_at": r.at + s * 60 + 50,
                "finished_at": None if live else r.at + s * 60 + 50, "status": status,
                "termination_reason": None if live else _JOB_REASON.get(status), "exit_status": None if live else 0,
                "job_spec": spec, "scheduling_facts": facts, "priority": 0, "blocks": 1, "log_offset": 0,
                "instance_id": ids.live_instances[r.i % RUNNING] if live else None, "price": 0.0,
                "placed_at": r.at + s * 60 + 5,
            }  # fmt: skip


def job_id(r: RunPlan, submission: int) -> str:
    return str(uuid.UUID(r.id[:-3] + f"{submission:03x}"))


_RUN_CHANGES = ("SUBMITTED -> PROVISIONING", "PROVISIONING -> RUNNING", "RUNNING -> TERMINATING")
_JOB_CHANGES = ("SUBMITTED -> PROVISIONING", "PROVISIONING -> PULLING", "PULLING -> RUNNING", "RUNNING -> TERMINATING")


def _event_rows(runs: list[RunPlan], now: float) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(event, target) pairs: the run's status changes and its last job's, as the recorder words them."""
    for r in runs:
        if r.at < now - EVENTS_WINDOW:
            continue
        jid = job_id(r, r.submissions - 1)
        changes = [
            ("run", r.id, r.name, f"Run status changed {c}")
            for c in (*_RUN_CHANGES, f"TERMINATING -> {r.status.upper()}")
        ]
        changes += [("job", jid, f"{r.name}-0-0", f"Job status changed {c}") for c in _JOB_CHANGES]
        for k, (kind, eid, name, message) in enumerate(changes):
            at, ev = round(r.at + k * 10 + r.i % 7 * 1e-6, 6), str(uuid.uuid4())
            yield (
                {"id": ev, "message": message, "recorded_at": at, "actor_user_id": None},
                {"event_id": ev, "recorded_at": at, "entity_type": kind, "entity_project_id": r.project,
                 "entity_id": eid, "entity_name": name, "entity_run_id": r.id, "entity_fleet_id": None},
            )  # fmt: skip


async def _events(db: Database, runs: list[RunPlan], now: float) -> int:
    n = 0
    pairs = _event_rows(runs, now)
    while True:
        chunk = [p for _, p in zip(range(BATCH), pairs, strict=False)]
        if not chunk:
            return n
        async with db.write() as conn:
            await conn.execute(sa.insert(t.events), [e for e, _ in chunk])
            await conn.execute(sa.insert(t.event_targets), [g for _, g in chunk])
        n += len(chunk)


def _log_rows(runs: list[RunPlan]) -> Iterator[dict[str, Any]]:
    finished = [r for r in runs if r.status != "running"][-LOGGED_RUNS:]
    for r in finished:
        jid = job_id(r, r.submissions - 1)
        for k in range(LOG_LINES):
            yield {"job_id": jid, "timestamp": r.at + k, "source": 0, "message": f"step {k}: loss 0.{k:03d}\n".encode()}


def _metric_rows(runs: list[RunPlan], now: float) -> Iterator[dict[str, Any]]:
    gpus = json.dumps([[40 * 10**9, 90]])
    for r in runs:
        if r.status != "running":
            continue
        jid = job_id(r, 0)
        for k in range(SAMPLES):
            yield {"job_id": jid, "timestamp_micro": int((now - 3600 + k * SAMPLE_EVERY) * 1e6),
                   "cpu_usage_micro": k * 5_000_000, "memory_usage_bytes": 2 * 10**9 + k,
                   "memory_working_set_bytes": 10**9 + k, "gpus": gpus}  # fmt: skip


async def fill(
    db: Database, tpl: Template, n: int, progress: Callable[[str, int, float], None], seal: Callable[[str], str]
) -> dict[str, int]:
    """Write the history; ``progress(what, rows, seconds)`` after each part; ``seal``: a user's token as the server
    stores it (sealed with its key). Returns the rows written per table."""
    now = time.time()
    done: dict[str, int] = {}

    async def part(name: str, rows: Iterator[dict[str, Any]], table: sa.Table) -> None:
        t0 = time.perf_counter()
        done[name] = await _insert(db, table, rows)
        progress(name, done[name], time.perf_counter() - t0)

    t0 = time.perf_counter()
    ids = await _accounts(db, now, seal)
    progress("users, projects, members", USERS + PROJECTS, time.perf_counter() - t0)
    await part("fleets", _fleet_rows(tpl, ids, now), t.fleets)
    await part("instances", _instance_rows(ids, now), t.instances)
    runs = plans(ids, n, now)
    await part("runs", _run_rows(tpl, runs, now), t.runs)
    await part("jobs", _job_rows(tpl, runs, ids), t.jobs)
    t0 = time.perf_counter()
    done["events"] = await _events(db, runs, now)
    progress("events (and their targets)", done["events"], time.perf_counter() - t0)
    await part("logs", _log_rows(runs), t.logs)
    await part("metric samples", _metric_rows(runs, now), t.job_metrics_points)
    t0 = time.perf_counter()
    async with db.write() as conn:
        await run_counts.recount(conn)  # written around the store: counted as the store would have
        if not db.is_sqlite:
            await conn.exec_driver_sql("ANALYZE")
    progress("run counts", 1, time.perf_counter() - t0)
    return done
