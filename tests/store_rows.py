"""Rows the store and worker tests start from, inserted directly: an admin user ``u`` and its project ``p``
(``main``), and runs of it."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store.tables import projects, runs, users


async def admin_and_project(conn: AsyncConnection, now: float) -> None:
    """User ``u`` (a global admin, ``admin``) and project ``p`` (``main``, owned by ``u``, no backends)."""
    await conn.execute(
        sa.insert(users).values(
            id="u", name="admin", token="t", token_hash="h", global_role="admin", active=True, deleted=False,
            created_at=now,
        )
    )  # fmt: skip
    await conn.execute(
        sa.insert(projects).values(
            id="p", name="main", owner_id="u", created_at=now, is_public=False, deleted=False, backends="[]"
        )
    )


async def a_run(conn: AsyncConnection, run_id: str, now: float, status: str = "submitted", name: str = "") -> None:
    """Run ``run_id`` of project ``p`` by user ``u`` (named ``name``, else its id), with an empty spec."""
    await conn.execute(
        sa.insert(runs).values(
            id=run_id, project_id="p", user_id="u", run_name=name or run_id, submitted_at=now, last_processed_at=now,
            status=status, run_spec="{}", priority=0, deployment_num=0, deleted=False,
        )
    )  # fmt: skip
