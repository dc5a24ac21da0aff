"""A page of runs (``runs/list``, ``dstack ps``) read by statements built once: the keys of a page and the runs and
jobs of its ids, every id bound one parameter each (a page has up to 100; more are read in chunks), give the records
that reading each run by itself gives (records whose every field is set, as their constructors set them), on SQLite
and on Postgres; and on SQLite none of it goes through SQLAlchemy's execution."""

from __future__ import annotations

import time
from dataclasses import fields, replace
from typing import Any

import sqlalchemy as sa

from corral.domain.records import RunRec
from corral.store import direct, prebuilt
from corral.store import runs as run_store
from corral.store.db import Database
from corral.store.migrate import upgrade
from corral.store.tables import jobs, projects
from store_rows import a_run, admin_and_project

#: More runs than a page, and than one chunk of ids (128), so that every length of ``IN`` list is read.
RUNS = 140


async def _db(url: str) -> Database:
    """``RUNS`` runs of project ``p``, one a second; every third one resubmitted twice (3 submissions of its job),
    every seventh one with two jobs; a run in ten finished."""
    db = Database(url)
    await upgrade(db)
    now = time.time()
    async with db.write() as conn:
        await admin_and_project(conn, now)
        rows = []
        for i in range(RUNS):
            run_id = f"r{i:03}"
            await a_run(conn, run_id, now + i, status="done" if i % 10 == 0 else "running")
            for job_num in range(2 if i % 7 == 0 else 1):
                for sub in range(3 if i % 3 == 0 else 1):
                    rows.append({
                        "id": f"j-{run_id}-{job_num}-{sub}", "run_id": run_id, "project_id": "p", "run_name": run_id,
                        "job_num": job_num, "job_name": f"{run_id}-{job_num}", "submission_num": sub,
                        "submitted_at": now + i + sub, "last_processed_at": now + i + sub, "status": "running",
                        "job_spec": f'{{"job_num": {job_num}}}', "job_provisioning_data": '{"hostname": "h"}',
                        "ready": sub == 1 or None, "probes": '[{"success_streak": 2}]',
                    })  # fmt: skip
        await direct.insert(conn, jobs, sa.insert(jobs), rows)
    return db


def _sqlalchemy_statements(db: Database) -> list[str]:
    """Every statement SQLAlchemy executes on ``db`` from now on."""
    seen: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_: Any) -> None:
        seen.append(statement)

    sa.event.listen(db.engine.sync_engine, "after_cursor_execute", record)
    return seen


def _latest(run: RunRec, submissions: int) -> RunRec:
    """``run`` with only the latest ``submissions`` submissions of each of its jobs."""
    top: dict[tuple[int, int], int] = {}
    for j in run.jobs:
        top[(j.replica_num, j.job_num)] = max(top.get((j.replica_num, j.job_num), -1), j.submission_num)
    kept = tuple(j for j in run.jobs if j.submission_num > top[(j.replica_num, j.job_num)] - submissions)
    return RunRec(**{**run.__dict__, "jobs": kept})


async def test_a_page_of_any_length_reads_as_each_run_by_itself(db_url: str) -> None:
    db = await _db(db_url)
    ids = [f"r{i:03}" for i in range(RUNS)]
    async with db.read() as conn:
        alone = {i: await run_store.get_run_by_id(conn, i) for i in ids}
    for run in alone.values():  # the store's records are those their constructors make, every field set
        assert run is not None and vars(run) == vars(replace(run)) and len(vars(run)) == len(fields(run))
        assert all(vars(j) == vars(replace(j)) and len(vars(j)) == len(fields(j)) for j in run.jobs)
    seen = _sqlalchemy_statements(db)
    # each length of list: one parameter each (1, 16), padded (17, 32, 33, 100), in two chunks (140); and the ids
    # given in any order, some twice
    lengths = (1, prebuilt.LISTED, prebuilt.LISTED + 1, 32, 33, 100, RUNS)
    async with db.write() as conn:  # the write engine's, which ``seen`` watches
        for n in lengths:
            chosen = ids[::-1][:n]
            assert await run_store.runs_by_ids(conn, chosen) == {i: alone[i] for i in chosen}, n
            for limit in (1, 2, 3):
                got = await run_store.runs_by_ids(conn, chosen, submissions_limit=limit)
                assert got == {i: _latest(alone[i], limit) for i in chosen if alone[i]}, (n, limit)  # type: ignore[arg-type]
            without = await run_store.runs_by_ids(conn, chosen, include_jobs=False)
            assert without == {i: RunRec(**{**alone[i].__dict__, "jobs": ()}) for i in chosen}  # type: ignore[union-attr]
        assert await run_store.runs_by_ids(conn, [ids[5], ids[5], ids[40]]) == {i: alone[i] for i in (ids[5], ids[40])}
        assert await run_store.runs_by_ids(conn, ["nope"]) == {}
        three = await run_store.runs_by_ids(conn, ids[:3], submissions_limit=1)
    assert [j.submission_num for j in three[ids[0]].jobs] == [2, 2]  # two jobs, the latest of each
    assert [j.ready for j in alone[ids[0]].jobs] == [None, True, None, None, True, None]  # type: ignore[union-attr]
    assert alone[ids[0]].jobs[0].probes == ({"success_streak": 2},)  # type: ignore[union-attr]
    if db.is_sqlite:
        assert seen == []
    await db.dispose()


async def test_a_pages_keys_follow_dstacks_filters_and_keyset(db_url: str) -> None:
    """The keys of a page (its runs' ids, newest first, or oldest first after a keyset) by projects (one, more than
    the ``IN`` lists bound one parameter each, none), by user and repo, active ones only."""
    db = await _db(db_url)
    now = time.time()
    many = [f"q{i:03}" for i in range(150)]  # more projects than a padded list holds: an expanding parameter
    async with db.write() as conn:
        await conn.execute(
            sa.insert(projects),
            [{"id": p, "name": p, "owner_id": "u", "created_at": now, "is_public": False, "deleted": False,
              "backends": "[]"} for p in many],
        )  # fmt: skip
    ids = [f"r{i:03}" for i in range(RUNS)]
    newest_first = ids[::-1]
    active = [i for i in newest_first if int(i[1:]) % 10]
    seen = _sqlalchemy_statements(db)
    async with db.write() as conn:  # the write engine's, which ``seen`` watches

        async def keys(*args: object, **kwargs: object) -> list[str]:
            return [k.id for k in await run_store.list_run_keys(conn, *args, **kwargs)]  # type: ignore[arg-type]

        assert await keys(["p"]) == newest_first[:100]
        assert await keys(None, limit=None) == newest_first
        assert await keys(["p"], only_active=True, limit=5) == active[:5]
        for projects_given in (["p", *many[:20]], ["p", *many[:40]], [*many[:70], "p"]):
            assert await keys(projects_given, limit=3) == newest_first[:3]
        assert await keys(many[:20]) == []
        assert await keys([]) == []
        assert await keys(["p"], user_id="u", limit=2) == newest_first[:2]
        assert await keys(["p"], user_id="nobody") == []
        assert await keys(["p"], repo_id="none") == []
        key = await run_store.list_run_keys(conn, ["p"], limit=10)
        after = (key[-1].last_processed_at, key[-1].id)  # a run's submission time is its last change here
        assert await keys(["p"], limit=10, after=after) == newest_first[10:20]
        assert await keys(["p"], limit=3, after=(key[0].last_processed_at, key[0].id), ascending=True) == []
        oldest = await run_store.list_run_keys(conn, ["p"], limit=1, ascending=True)
        first = (oldest[0].last_processed_at, oldest[0].id)
        assert await keys(["p"], limit=3, after=first, ascending=True) == ids[1:4]
        through_driver = len(seen)
        assert await keys([*many, "p"], limit=2) == newest_first[:2]  # 151 projects: an expanding parameter
    if db.is_sqlite:
        assert through_driver == 0, seen
    await db.dispose()
