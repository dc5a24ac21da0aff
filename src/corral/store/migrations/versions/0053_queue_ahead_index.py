"""ix_jobs_queue_ahead: the waiting jobs by project, priority and age, so that a waiting run's place in its
project's queue (``store/runs.queue_position``, on every ``runs/get`` of a queued run) is counted from the index
alone, not from each waiting job's row (``QUEUED_SQL``)

Revision ID: 0053
Revises: 0052
Create Date: 2026-12-07 19:45:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0053"
down_revision = "0052"
branch_labels = None
depends_on = None

#: ``store/tables.QUEUED_SQL`` as it was when this revision was written.
_QUEUED = "status = 'submitted' AND instance_id IS NULL"


def upgrade() -> None:
    op.create_index(
        "ix_jobs_queue_ahead",
        "jobs",
        ["project_id", "priority", "submitted_at", "id", "status", "instance_id"],
        unique=False,
        sqlite_where=sa.text(_QUEUED),
        postgresql_where=sa.text(_QUEUED),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_queue_ahead", table_name="jobs")
