"""ix_jobs_queued: the queue's own index (a partial index of the jobs waiting to be placed, with what a
scheduling pass reads of a job it has seen), so that a pass reads the queue without touching the table and
the index's size is the queue's, whatever the history

Revision ID: 0025
Revises: 0023
Create Date: 2026-12-04 15:20:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0023"
branch_labels = None
depends_on = None

_QUEUED = "status = 'submitted' AND instance_id IS NULL"


def upgrade() -> None:
    op.create_index(
        "ix_jobs_queued",
        "jobs",
        ["id", "priority", "status_message"],
        unique=False,
        sqlite_where=sa.text(_QUEUED),
        postgresql_where=sa.text(_QUEUED),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_queued", table_name="jobs")
