"""service replicas' readiness: whether the proxy routes to a replica, its probes' streaks, when it was last ready

Revision ID: 0014
Revises: 0011
Create Date: 2026-12-01 14:10:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("ready", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("probes", sa.Text(), nullable=True))
        batch.add_column(sa.Column("ready_at", sa.Float(precision=53), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("ready_at")
        batch.drop_column("probes")
        batch.drop_column("ready")
