"""jobs.ssh_seen_at: when the job's SSH endpoint last saw a connection that counts (dev environments'
``inactivity_duration``)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01 14:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("ssh_seen_at", sa.Float(precision=53), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("ssh_seen_at")
