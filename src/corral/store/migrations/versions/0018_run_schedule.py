"""runs.schedule, runs.next_triggered_at, runs.job_templates: a scheduled run (``schedule``) waits
``pending`` for its next trigger, and its jobs are submitted from the stored templates when it fires

Revision ID: 0018
Revises: 0015
Create Date: 2026-12-01 17:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("schedule", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("next_triggered_at", sa.Float(precision=53), nullable=True))
        batch_op.add_column(sa.Column("job_templates", sa.Text(), nullable=True))
    op.create_index("ix_runs_next_triggered_at", "runs", ["next_triggered_at"])


def downgrade() -> None:
    op.drop_index("ix_runs_next_triggered_at", table_name="runs")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("job_templates")
        batch_op.drop_column("next_triggered_at")
        batch_op.drop_column("schedule")
