"""run_counts and run_pending_counts: the runs of each project and user by status, kept with every write of a
run's status, so that ``GET /metrics`` reads a few rows instead of counting every run ever submitted; filled
from the runs there are. The retries counted by run_pending_counts start at zero.

Revision ID: 0032
Revises: 0026
Create Date: 2026-12-06 09:10:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0032"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_counts",
        sa.Column("project_id", sa.String(36), primary_key=True),
        sa.Column("user_id", sa.String(36), primary_key=True),
        sa.Column("status", sa.String(20), primary_key=True),
        sa.Column("count", sa.Integer, nullable=False),
    )
    op.create_table(
        "run_pending_counts",
        sa.Column("project_id", sa.String(36), primary_key=True),
        sa.Column("run_type", sa.String(20), primary_key=True),
        sa.Column("count", sa.Integer, nullable=False),
    )
    op.execute(
        "INSERT INTO run_counts (project_id, user_id, status, count) "
        "SELECT project_id, user_id, status, COUNT(*) FROM runs GROUP BY project_id, user_id, status"
    )


def downgrade() -> None:
    op.drop_table("run_pending_counts")
    op.drop_table("run_counts")
