"""Migrations: the schema they build is exactly the tables' metadata, and the fast head check agrees
with Alembic."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from corral.store.db import Database
from corral.store.migrate import _current, alembic_config, head_revisions, upgrade
from corral.store.tables import metadata


def test_fast_head_check_matches_alembic() -> None:
    assert head_revisions() == set(ScriptDirectory.from_config(alembic_config()).get_heads())


def _upgrade_to(rev: str) -> Any:
    """For ``run_sync``: Alembic's upgrade of that connection to ``rev``."""

    from alembic import command

    def run(sync_conn: sa.Connection) -> None:
        cfg = alembic_config()
        cfg.attributes["connection"] = sync_conn
        command.upgrade(cfg, rev)

    return run


async def test_upgrade_builds_the_metadata_and_is_idempotent(db_url: str) -> None:
    db = Database(db_url)
    await upgrade(db)
    await upgrade(db)
    assert await _current(db) == head_revisions()

    def diff(conn: sa.Connection) -> list[object]:
        return list(compare_metadata(MigrationContext.configure(conn), metadata))

    async with db.engine.connect() as conn:
        assert await conn.run_sync(diff) == []
    await db.dispose()


async def test_0008_leaves_the_local_backend_to_main_only(db_url: str) -> None:
    """Projects made through the API used to get the local backend; after the upgrade only ``main`` keeps
    its backends (the server re-applies ``config.yml``'s at start)."""
    db = Database(db_url)

    async with db.engine.connect() as conn:
        await conn.run_sync(_upgrade_to("0006"))
        await conn.execute(
            sa.text(
                "INSERT INTO users (id, name, token, token_hash, global_role, active, deleted, created_at) "
                "VALUES ('u', 'admin', 't', 'h', 'admin', true, false, 0)"
            )
        )
        for pid, name in (("p1", "main"), ("p2", "made-by-api")):
            await conn.execute(
                sa.text(
                    "INSERT INTO projects (id, name, owner_id, created_at, is_public, deleted, backends) "
                    "VALUES (:id, :name, 'u', 0, false, false, :b)"
                ),
                {"id": pid, "name": name, "b": '[{"type": "local"}]'},
            )
        await conn.commit()
        await conn.run_sync(_upgrade_to("head"))
        await conn.commit()
        rows = {r.name: r.backends for r in (await conn.execute(sa.text("SELECT name, backends FROM projects"))).all()}
    assert rows == {"main": '[{"type": "local"}]', "made-by-api": "[]"}
    await db.dispose()


async def test_0043_adds_the_instances_version_to_a_database_whose_jobs_reference_its_instances(db_url: str) -> None:
    """The column is added in place: on SQLite a copy of the table could not replace one whose rows jobs reference."""
    db = Database(db_url)

    rows = {
        "users": "(id, name, token, token_hash, global_role, active, deleted, created_at) "
        "VALUES ('u', 'admin', 't', 'h', 'admin', true, false, 0)",
        "projects": "(id, name, owner_id, created_at, is_public, deleted, backends) "
        "VALUES ('p', 'main', 'u', 0, false, false, '[]')",
        "instances": "(id, project_id, name, instance_num, status, unreachable, backend, busy_blocks, created_at, "
        "deleted, last_processed_at) VALUES ('i', 'p', 'i', 0, 'busy', false, 'ssh', 1, 0, false, 0)",
        "runs": "(id, project_id, user_id, run_name, submitted_at, last_processed_at, status, run_spec, priority, "
        "deployment_num, deleted) VALUES ('r', 'p', 'u', 'r', 0, 0, 'running', '{}', 0, 0, false)",
        "jobs": "(id, run_id, project_id, run_name, job_num, replica_num, job_name, submission_num, deployment_num, "
        "submitted_at, last_processed_at, status, job_spec, priority, blocks, log_offset, instance_id) "
        "VALUES ('j', 'r', 'p', 'r', 0, 0, 'j', 0, 0, 0, 0, 'running', '{}', 0, 1, 0, 'i')",
    }
    async with db.engine.connect() as conn:
        await conn.run_sync(_upgrade_to("0040"))
        for table, values in rows.items():
            await conn.execute(sa.text(f"INSERT INTO {table} {values}"))
        await conn.commit()
        await conn.run_sync(_upgrade_to("head"))
        await conn.commit()
        got = (
            await conn.execute(sa.text("SELECT i.version FROM instances i JOIN jobs j ON j.instance_id = i.id"))
        ).all()
    assert [tuple(r) for r in got] == [(0,)]
    await db.dispose()


async def test_0049_marks_the_terminated_instances_deleted_but_an_ssh_hosts_failure(db_url: str) -> None:
    """A database from before: its terminated instances become deleted (as dstack marks them once terminated), an SSH
    fleet's host that failed stays listed with its error, and the live ones are left as they were."""
    db = Database(db_url)

    async with db.engine.connect() as conn:
        await conn.run_sync(_upgrade_to("0048"))
        await conn.execute(
            sa.text(
                "INSERT INTO users (id, name, token, token_hash, global_role, active, deleted, created_at) "
                "VALUES ('u', 'admin', 't', 'h', 'admin', true, false, 0)"
            )
        )
        await conn.execute(
            sa.text(
                "INSERT INTO projects (id, name, owner_id, created_at, is_public, deleted, backends) "
                "VALUES ('p', 'main', 'u', 0, false, false, '[]')"
            )
        )
        for iid, status, backend, reason in (
            ("gone", "terminated", "aws", "idle_timeout"),
            ("failed-host", "terminated", "ssh", "error"),
            ("removed-host", "terminated", "ssh", "terminated_by_user"),
            ("live", "idle", "local", None),
        ):
            await conn.execute(
                sa.text(
                    "INSERT INTO instances (id, project_id, name, instance_num, status, unreachable, backend, "
                    "busy_blocks, created_at, deleted, last_processed_at, termination_reason) "
                    "VALUES (:id, 'p', :id, 0, :status, false, :backend, 0, 0, false, 0, :reason)"
                ),
                {"id": iid, "status": status, "backend": backend, "reason": reason},
            )
        await conn.commit()
        await conn.run_sync(_upgrade_to("head"))
        await conn.commit()
        got = {str(r[0]): bool(r[1]) for r in (await conn.execute(sa.text("SELECT id, deleted FROM instances"))).all()}
    assert got == {
        "gone": True,
        "failed-host": False,
        "removed-host": True,
        "live": False,
    }
    await db.dispose()
