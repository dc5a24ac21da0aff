"""ix_runs_active, ix_runs_project_active: partial indexes of the runs that have not finished, so that the
runs worker's pass, ``runs/list``'s ``only_active`` (``dstack ps``) and a project's live runs read the active
runs alone, not every finished run of the history; ix_jobs_preempted: the jobs a preemption stopped, which a
scheduling pass with preemption on reads, not every job

Revision ID: 0038
Revises: 0036
Create Date: 2026-12-06 11:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0038"
down_revision = "0036"
branch_labels = None
depends_on = None

_ACTIVE = "status NOT IN ('terminated', 'failed', 'done')"
_PREEMPTED = "stop_requested = 'preempted'"


def upgrade() -> None:
    for name, columns in (
        ("ix_runs_active", ["submitted_at", "id"]),
        ("ix_runs_project_active", ["project_id", "submitted_at", "id"]),
    ):
        op.create_index(
            name, "runs", columns, unique=False, sqlite_where=sa.text(_ACTIVE), postgresql_where=sa.text(_ACTIVE)
        )
    op.create_index(
        "ix_jobs_preempted",
        "jobs",
        ["finished_at"],
        unique=False,
        sqlite_where=sa.text(_PREEMPTED),
        postgresql_where=sa.text(_PREEMPTED),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_preempted", table_name="jobs")
    op.drop_index("ix_runs_project_active", table_name="runs")
    op.drop_index("ix_runs_active", table_name="runs")
