"""jobs.price and jobs.placed_at: the price ($/hour) of a job's instance when it was placed, and when, from
which its cost is counted (a later price change never rewrites it); null for jobs stored before, which cost 0

Revision ID: 0026
Revises: 0027
Create Date: 2026-12-06 08:10:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("price", sa.Float(), nullable=True))
        batch.add_column(sa.Column("placed_at", sa.Float(precision=53), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("placed_at")
        batch.drop_column("price")
