"""ix_runs_user_submitted: a user's runs in keyset order, so that runs/list by username reads that user's runs
alone, not every user's newest runs until it has a page of theirs

Revision ID: 0040
Revises: 0039
Create Date: 2026-12-06 12:10:00
"""

from alembic import op

revision = "0040"
down_revision = "0039"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_runs_user_submitted", "runs", ["user_id", "submitted_at", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_runs_user_submitted", table_name="runs")
