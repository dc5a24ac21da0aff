"""jobs.queued_at: the time a job keeps its place in the queue by, when it is not its submission time (a
preempted job's new submission waits in its run's original place); null: its submission time

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-02 05:05:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("queued_at", sa.Float(precision=53), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("queued_at")
