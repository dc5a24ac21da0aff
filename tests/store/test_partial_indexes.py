"""The partial indexes (unique over live, not soft-deleted, rows; the queue's own index): the metadata
states their predicate for the dialect in use (Postgres's is attached when a Postgres database is opened)
and it is the one the migrations built."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.schema import CreateIndex

from corral.store import (
    capacity_counts,
    fleet_reader,
    instance_outcomes,
    leases,
    prebuilt,
    preemption,
    queue_reader,
    run_states,
    runs,
    service_drains,
    service_scaling,
    snapshot,
    tables,
)
from corral.store.db import Database
from corral.store.migrate import upgrade
from store_rows import admin_and_project

#: The partial indexes other than the live-unique ones, and what Postgres's rendering of each predicate holds.
POSTGRES_TERMS = {
    "ux_gateways_project_default": ("is_default",),
    "ix_runs_active": ("'terminated'", "'failed'", "'done'"),
    "ix_runs_project_active": ("'terminated'", "'failed'", "'done'"),
    "ix_jobs_queued": ("'submitted'", "instance_id IS NULL"),
    "ix_jobs_queue_ahead": ("'submitted'", "instance_id IS NULL"),
    "ix_jobs_preempted": ("'preempted'",),
    "ix_jobs_leased": ("lock_owner IS NOT NULL",),
    "ix_instances_live": ("NOT deleted", "'terminated'"),
    "ix_instances_live_backend": ("NOT deleted", "'terminated'"),
    "ix_instances_live_fleet": ("NOT deleted", "'terminated'", "'ssh'", "'error'"),
    "ix_runs_services": ("service_templates IS NOT NULL",),
}


async def test_live_unique_indexes_have_the_predicate_the_migrations_built(db_url: str) -> None:
    db = Database(db_url)
    await upgrade(db)
    # projects, fleets, live instances, volumes, gateways' default, runs; the active runs, the services; the queue,
    # preempted and leased jobs; the live fleets of their list and the instances a fleet lists (``instances/list``
    # reads every instance, the deleted ones too, as dstack's does: a full index)
    assert sorted(i.name for i, _ in tables._POSTGRES_WHERE if i.name in POSTGRES_TERMS) == sorted(POSTGRES_TERMS)
    assert len(tables._POSTGRES_WHERE) == 16
    async with db.read() as conn:
        for index, where in tables._POSTGRES_WHERE:
            expected = str(index.dialect_options["sqlite"]["where"]) if db.is_sqlite else where
            ddl = str(CreateIndex(index).compile(dialect=conn.dialect))
            assert ddl.endswith(f"WHERE {expected}"), ddl
            if db.is_sqlite:
                query = sa.text("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = :n")
            else:
                query = sa.text("SELECT indexdef FROM pg_indexes WHERE indexname = :n")
            built = (await conn.execute(query, {"n": index.name})).scalar_one()
            if db.is_sqlite:
                assert built.endswith(f"WHERE {expected}"), built
            elif where == "deleted = false":
                assert expected in built, built
            elif index.name == "ux_gateways_project_default":  # Postgres writes it: WHERE (is_default = true)
                assert "is_default" in built and ("= 1" in built or "true" in built), built
            else:  # Postgres writes the predicate its own way: ((status)::text = 'submitted'::text) AND ...
                assert all(term in built for term in POSTGRES_TERMS[str(index.name)]), built
    await db.dispose()


async def test_the_queue_is_read_from_its_own_index_alone(db_url: str) -> None:
    """A scheduling pass reads the queue's state from ``ix_jobs_queued`` without the table's rows; on SQLite
    it names the index (its planner would take ``ix_jobs_instance_status`` and read every row)."""
    db = Database(db_url)
    await upgrade(db)
    async with db.read() as conn:
        if db.is_sqlite:
            query = queue_reader._QUEUE_STATE["sqlite"]
            plan = [row[-1] for row in (await conn.execute(sa.text(f"EXPLAIN QUERY PLAN {query}"))).all()]
            assert plan == ["SCAN jobs USING INDEX ix_jobs_queued"], plan
        else:  # Postgres picks by cost: on an empty table, with the cheaper ways off, that it can
            await _cheaper_scans_off(conn)
            query = queue_reader._QUEUE_STATE["postgresql"]
            plan = [row[0] for row in (await conn.execute(sa.text(f"EXPLAIN {query}"))).all()]
            # by cost: the queue's own index alone, or on a table this small another index of the queue alone
            assert plan[0].startswith(("Index Only Scan using ix_jobs_queued", "Index Scan using ix_jobs_queue")), plan
    await db.dispose()


async def test_the_live_instances_state_is_read_from_its_own_index_alone(db_url: str) -> None:
    """A scheduling pass reads every live instance's (id, fleet, version) from ``ix_instances_live`` without the
    table's rows (``store/fleet_reader.py``), whatever the terminated instances of the history."""
    db = Database(db_url)
    await upgrade(db)
    async with db.read() as conn:
        if db.is_sqlite:
            query = fleet_reader.STATE_SQL["sqlite"]
            plan = [row[-1] for row in (await conn.execute(sa.text(f"EXPLAIN QUERY PLAN {query}"))).all()]
            assert plan == ["SCAN instances USING COVERING INDEX ix_instances_live"], plan
        else:
            await _cheaper_scans_off(conn)
            query = fleet_reader.STATE_SQL["postgresql"]
            plan = [row[0] for row in (await conn.execute(sa.text(f"EXPLAIN {query}"))).all()]
            # by cost: the live instances' own index alone, or the smaller one of their backends and their rows
            assert plan[0].startswith(
                ("Index Only Scan using ix_instances_live ", "Index Scan using ix_instances_live")
            ), plan
    await db.dispose()


def _instances(n: int, live: int) -> list[dict[str, object]]:
    """``n`` instances of project ``p`` on ssh and aws, the first ``live`` of them idle, the rest terminated (a
    third of those deleted)."""
    return [
        {"id": f"i{k}", "project_id": "p", "name": f"i{k}", "instance_num": k, "backend": "ssh" if k % 2 else "aws",
         "status": "terminated" if k >= live else "idle", "deleted": k >= live and k % 3 == 0,
         "created_at": float(k), "last_processed_at": float(k)}
        for k in range(n)
    ]  # fmt: skip


async def _cheaper_scans_off(conn: AsyncConnection) -> None:
    """Postgres picks by cost: on a table this small, with the cheaper scans off, the index it can use."""
    await conn.execute(sa.text("SET LOCAL enable_seqscan = off"))
    await conn.execute(sa.text("SET LOCAL enable_bitmapscan = off"))


async def _plan(conn: AsyncConnection, statement: sa.ClauseElement, sqlite: bool) -> str:
    sql = str(statement.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
    explain = "EXPLAIN QUERY PLAN" if sqlite else "EXPLAIN"
    return " | ".join(str(r[-1] if sqlite else r[0]) for r in (await conn.exec_driver_sql(f"{explain} {sql}")).all())


async def _history(conn: AsyncConnection, finished: int) -> None:
    """``finished`` runs that ended (one job each, on instance ``i``, every tenth preempted) and two active runs,
    in project ``p``; all but the first two (user ``v``'s) by user ``u``."""
    await admin_and_project(conn, 0.0)
    statuses = ["done", "failed", "terminated"]
    run_rows = [
        {"id": f"r{i}", "project_id": "p", "user_id": "u", "run_name": f"r{i}", "submitted_at": float(i),
         "last_processed_at": float(i), "status": statuses[i % 3] if i < finished else "running", "run_spec": "{}",
         "priority": 0, "deployment_num": 0, "deleted": False}
        for i in range(finished + 2)
    ]  # fmt: skip
    job_rows = [
        {"id": f"j{i}", "run_id": f"r{i}", "project_id": "p", "run_name": f"r{i}", "job_num": 0, "replica_num": 0,
         "job_name": f"r{i}-0-0", "submission_num": 0, "deployment_num": 0, "submitted_at": float(i),
         "last_processed_at": float(i), "finished_at": float(i), "status": "terminated", "job_spec": "{}",
         "priority": 0, "blocks": 1, "log_offset": 0, "instance_id": "i",
         "stop_requested": "preempted" if i % 10 == 0 else None, "lock_owner": "srv" if i % 100 == 0 else None}
        for i in range(finished)
    ]  # fmt: skip
    await conn.execute(
        sa.insert(tables.instances).values(
            id="i", project_id="p", name="i", instance_num=0, status="idle", backend="ssh", created_at=0.0,
            last_processed_at=0.0,
        )
    )  # fmt: skip
    await conn.execute(
        sa.insert(tables.users).values(
            id="v", name="few", token="t2", token_hash="h2", global_role="user", active=True, deleted=False,
            created_at=0.0,
        )
    )  # fmt: skip
    run_rows[0]["user_id"] = run_rows[1]["user_id"] = "v"
    await conn.execute(sa.insert(tables.runs), run_rows)
    await conn.execute(sa.insert(tables.jobs), job_rows)
    if conn.dialect.name == "postgresql":
        await conn.exec_driver_sql("ANALYZE runs")
        await conn.exec_driver_sql("ANALYZE jobs")


async def test_active_runs_and_preempted_jobs_are_read_from_their_own_indexes(db_url: str) -> None:
    """With a history of finished runs, a project's active runs (``dstack ps``), every active run (the runs
    worker's pass), the active runs of every project (an admin's list), the recent preemption victims and the
    leased jobs (dropped at a SQLite server's start) and the live services (the service scaling worker's pass) are
    read from partial indexes whose size is the live
    workload's, not from indexes of the whole history; a user's runs from their own index."""
    db = Database(db_url)
    await upgrade(db)
    active = ("ix_runs_active", "ix_runs_project_active")
    cases = [
        (runs.run_keys_query(["p"], only_active=True), ("ix_runs_project_active",)),
        (runs.run_keys_query(None, only_active=True), ("ix_runs_active",)),
        (run_states.ACTIVE_RUNS, active),  # unordered: either is the active runs alone
        (preemption.ENDED_VICTIMS.params(since=0.0), ("ix_jobs_preempted",)),
        (instance_outcomes.DROP_JOB_LEASES, ("ix_jobs_leased",)),
        (runs.run_keys_query(None, user_id="v"), ("ix_runs_user_submitted",)),  # a user with 2 runs of 3,002
        (service_scaling.LIVE_SERVICES, ("ix_runs_services",)),  # no service among the live runs
    ]
    async with db.write() as conn:
        await _history(conn, 3000)
    async with db.read() as conn:
        for statement, indexes in cases:
            plan = await _plan(conn, statement, db.is_sqlite)
            assert any(f" {index}" in plan for index in indexes), (indexes, plan)
        # the service drains held (few) are pruned by looking their jobs up, never by walking the finished jobs
        plan = await _plan(conn, service_drains.ENDED_DRAINS, db.is_sqlite)
        assert "ix_jobs_status_queue" not in plan and "service_drains" in plan, plan
    await db.dispose()


async def test_the_jobs_that_joined_the_queue_are_looked_up_by_their_ids(db_url: str) -> None:
    """A pass reads the jobs first seen since the last (``queue_reader._WHOLE``) through the primary key, a step
    per job read, and never walks the queue for them: with the queue's own terms in the statement, SQLite's
    planner read ``ix_jobs_instance_status`` (every waiting job) to find the few asked for."""
    db = Database(db_url)
    await upgrade(db)
    async with db.write() as conn:
        await _history(conn, 3000)
        await conn.execute(sa.update(tables.jobs).values(status="submitted", instance_id=None, finished_at=None))
        if conn.dialect.name == "postgresql":
            await conn.exec_driver_sql("ANALYZE jobs")
    async with db.read() as conn:
        if not db.is_sqlite:  # Postgres picks by cost: on a table this small, with the cheaper ways off, that it can
            await _cheaper_scans_off(conn)
        # a pass's worth of applies since the last one
        plan = await _plan(conn, queue_reader._WHOLE.params(ids=[f"j{i}" for i in range(0, 3000, 75)]), db.is_sqlite)
        assert "ix_jobs_instance_status" not in plan and "ix_jobs_status_queue" not in plan, plan
        if db.is_sqlite:
            assert "SEARCH jobs USING INDEX sqlite_autoindex_jobs_1 (id=?)" in plan, plan
        else:
            assert "jobs_pkey" in plan, plan
    async with db.write() as conn:
        await conn.execute(sa.update(tables.jobs).where(tables.jobs.c.id == "j7").values(instance_id="i"))
        await conn.execute(sa.update(tables.jobs).where(tables.jobs.c.id == "j8").values(status="terminated"))
    async with db.read() as conn:
        rows = await queue_reader._read_whole(conn, ["j7", "j8", "j9", "gone"])
        assert [r.id for r in rows] == ["j9"]
    await db.dispose()


async def test_the_jobs_of_a_scoped_jobs_pass_are_looked_up_by_their_ids(db_url: str) -> None:
    """The jobs worker's pass over the jobs a placement handed over (``runs.list_jobs`` with ``ids``) reads them
    through the primary key, a few ids or many, never the active jobs' status index for them; and it returns
    only those of the statuses asked for."""
    db = Database(db_url)
    await upgrade(db)
    async with db.write() as conn:
        await _history(conn, 3000)
        await conn.execute(sa.update(tables.jobs).values(status="running", finished_at=None))
        await conn.execute(sa.update(tables.jobs).where(tables.jobs.c.id == "j5").values(status="done"))
        if conn.dialect.name == "postgresql":
            await conn.exec_driver_sql("ANALYZE jobs")
    active = ["provisioning", "pulling", "running"]
    async with db.read() as conn:
        if not db.is_sqlite:
            await _cheaper_scans_off(conn)
        few, many = [f"j{i}" for i in range(3, 13)], [f"j{i}" for i in range(0, 3000, 75)]
        for statement in (
            runs._jobs_listed(tuple(active), len(few), False).params(prebuilt.ids_params(few)),
            runs._LISTED_JOBS[(True, False)].params(ids=many, statuses=active),
        ):
            plan = await _plan(conn, statement, db.is_sqlite)
            assert "ix_jobs_status_queue" not in plan and "ix_jobs_instance_status" not in plan, plan
            assert ("(id=?)" in plan) if db.is_sqlite else ("jobs_pkey" in plan), plan
        assert [j.id for j in await runs.list_jobs(conn, active, ids=few)] == [f"j{i}" for i in range(3, 13) if i != 5]
        listed = await runs.list_jobs(conn, active, ids=[*many, "j5", "gone"])
        assert sorted(j.id for j in listed) == sorted(many)
    await db.dispose()


async def test_a_batch_of_job_leases_is_claimed_by_the_jobs_ids(db_url: str) -> None:
    """``leases.claim_many`` (the jobs worker's claim of the jobs it starts) finds them by their ids, with their
    status checked on each row (``store/unindexed.py``), never by the status's index (every job of that status)."""
    db = Database(db_url)
    await upgrade(db)
    async with db.write() as conn:
        await _history(conn, 3000)
        await conn.execute(sa.update(tables.jobs).values(status="provisioning", finished_at=None, lock_owner=None))
        if conn.dialect.name == "postgresql":
            await conn.exec_driver_sql("ANALYZE jobs")
    many = [f"j{i}" for i in range(0, 3000, 75)]
    async with db.read() as conn:
        if not db.is_sqlite:
            await _cheaper_scans_off(conn)
        statement = leases.claim_many_statement(tables.jobs, many, 10.0, ("provisioning",)).values(lock_owner="s")
        plan = await _plan(conn, statement, db.is_sqlite)
        assert "ix_jobs_status_queue" not in plan, plan
        assert ("(id=?)" in plan) if db.is_sqlite else ("jobs_pkey" in plan), plan
    async with db.write() as conn:
        await conn.execute(sa.update(tables.jobs).where(tables.jobs.c.id == "j75").values(status="running"))
        claimed = await leases.claim_many(conn, tables.jobs, many, "s", 10.0, 30.0, ("provisioning",))
    assert sorted(claimed) == sorted(j for j in many if j != "j75")
    await db.dispose()


async def test_a_backends_live_instances_are_counted_from_their_own_index(db_url: str) -> None:
    """A scheduling pass's count of the local backend's instances (``snapshot.backend_usage_and_blocks``) and
    the commit point's recount of a backend's limit read ``ix_instances_live_backend``: that backend's live
    instances, not the instances of every backend, nor the thousands the history left terminated."""
    db = Database(db_url)
    await upgrade(db)
    async with db.write() as conn:
        await admin_and_project(conn, 0.0)
        await conn.execute(sa.insert(tables.instances), _instances(3000, live=20))
        local = [
            {"id": f"l{n}", "project_id": "p", "name": f"l{n}", "instance_num": n, "backend": "local",
             "status": "busy", "offer": '{"host_blocks": 2}', "deleted": False, "created_at": 0.0,
             "last_processed_at": 0.0}
            for n in range(3)
        ]  # fmt: skip
        await conn.execute(sa.insert(tables.instances), local)
        if conn.dialect.name == "postgresql":
            await conn.exec_driver_sql("ANALYZE instances")
    async with db.read() as conn:
        for statement in (
            snapshot._LIVE_OFFERS.params(backend="local"),
            capacity_counts.backend_instances_query("local"),
        ):
            plan = await _plan(conn, statement, db.is_sqlite)
            assert "ix_instances_live_backend" in plan, plan
        assert await snapshot.backend_usage_and_blocks(conn, "local") == (3, 6)
        assert await capacity_counts.backend_instances(conn, "ssh") == 10
    await db.dispose()


async def test_a_waiting_runs_place_is_counted_from_the_queues_own_index(db_url: str) -> None:
    """``runs/get`` of a queued run counts the waiting jobs ahead of it (``runs.queue_position``) from
    ``ix_jobs_queue_ahead`` alone: a step per job ahead in the index, never a read of each one's row (at 64,000
    queued, 110 ms of the server's CPU per ``runs/get`` read them through ``ix_jobs_status_queue`` and the rows)."""
    db = Database(db_url)
    await upgrade(db)
    async with db.write() as conn:
        await _history(conn, 3000)
        await conn.execute(
            sa.update(tables.jobs).values(
                status="submitted",
                instance_id=None,
                finished_at=None,
                priority=sa.cast(tables.jobs.c.submitted_at, sa.Integer) % 3,
            )
        )
        if conn.dialect.name == "postgresql":
            await conn.exec_driver_sql("ANALYZE jobs")
    async with db.read() as conn:
        if not db.is_sqlite:
            await _cheaper_scans_off(conn)
        statement = runs._AHEAD.params(project="p", priority=1, at=1500.0, _id="j1500")
        if db.is_sqlite:  # as it runs: its values bound (a partial index serves a literal term, not a parameter)
            compiled = statement.compile(dialect=conn.dialect)
            values = tuple(compiled.params[name] for name in compiled.positiontup or ())
            rows = (await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}", values)).all()
            plan = " | ".join(str(r[-1]) for r in rows)
            assert "COVERING INDEX ix_jobs_queue_ahead" in plan and "ix_jobs_status_queue" not in plan, plan
        else:
            plan = await _plan(conn, statement, db.is_sqlite)
            assert "Index Only Scan using ix_jobs_queue_ahead" in plan, plan
        # of 3,000 waiting jobs at priorities 0-2 (the submission time modulo 3): those of priority 2, and the
        # earlier ones of priority 1
        job = await runs.get_job(conn, "j1501")
        assert job is not None and job.priority == 1
        assert await runs.queue_position(conn, job) == 1000 + 500 + 1
    await db.dispose()
